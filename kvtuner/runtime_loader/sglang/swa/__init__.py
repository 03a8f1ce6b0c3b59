"""SGLang's hybrid sliding-window pool (``SWAKVPool``) with kvtuner sub-pools."""
