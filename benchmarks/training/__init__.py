"""Training the shipped models (the tiny model and the retrieval model) and evaluating them."""
