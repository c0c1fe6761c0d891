"""The shared kernel beneath every app: ids and times, the application errors, database and
logging helpers, strict environment readers, the commands' CLI helpers, secret sealing and
redaction, and small admin and rendering helpers. It imports no app of this project
(docs/architecture.md, "Layers")."""
