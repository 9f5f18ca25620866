"""Quantizing caches: every token kept, stored packed (affine, KIVI, TurboQuant, QJL).

`tokencache` / `tokenbatch` are the shared per-token store of affine, TurboQuant and QJL; KIVI
has its own row layout (`kivi_rows`) because its keys are grouped along tokens."""
