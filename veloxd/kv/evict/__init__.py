"""Evicting caches: fp16 keys and values of the tokens a policy keeps (streaming_llm, knorm,
snapkv, tova, h2o) over one shared engine (`engine`: slots tagged with positions, `slots`,
`attention`, `batch`)."""
