"""The browser lab: a small local server (server.py), its JSON API (api.py) and the packaged page (static/)."""
