"""lab: the browser lab — a small local server (server.py), its JSON API (api.py, attribution_api.py, the
bodies they share in bodies.py) and the packaged page (static/: app.js the shell, one file per view).

The top floor: may import every wing below it (model, lesson, data, decoding, interpret, inference)."""
