"""Getting models: the download phase that runs before a worker loads a Hugging Face model.

`protocol` and `cache` are stdlib-only (the daemon uses them); `hub` and `fetch` use
huggingface_hub and run only in the `veloxd pull` process, never in the daemon.
"""
