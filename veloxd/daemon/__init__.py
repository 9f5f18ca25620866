"""The supervising daemon (`veloxd run`): one worker per config entry, reload on edit, JSON logs."""
