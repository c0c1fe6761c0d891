"""Views of the browser dashboard: thin, they call orchestration's and delivery's services and
selectors."""
