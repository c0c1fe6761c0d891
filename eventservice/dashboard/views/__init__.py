"""Views of the browser dashboard: thin, they call orchestration's services and selectors."""
