"""The one door to mlx_lm's internals (tested range: mlx-lm 0.32.x).

No other veloxd module names a private mlx_lm attribute (tests/serve/test_serve_mlx_compat.py
checks the package for it and pins every name used here). One module per part of mlx_lm it
plugs into:
- `models`: the cache base class, the architecture lookup, the version check;
- `provider`: the argument namespace mlx_lm's server reads, and `ModelProvider._load` hooked (the
  model loads on mlx_lm's generation thread, where its arrays must live);
- `generators`: `ResponseGenerator` subclassed (a request whose client left, or a shutdown,
  stops generating; idle distributed ranks sleep);
- `handler`: `APIHandler` subclassed (bearer auth, model pinning, a /v1/models that needs no
  Hugging Face cache, request counters on GET /veloxd/stats, request limits);
- `httpd`: the HTTP server run with that handler (mlx_lm's own `run()` ignores `handler_class`).
An mlx_lm upgrade that changes any of this breaks here and in tests/serve/test_serve_mlx_compat.py.
"""
