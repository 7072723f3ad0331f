"""The structured report model and its renderers: the text and report.html (never parsing text)."""
