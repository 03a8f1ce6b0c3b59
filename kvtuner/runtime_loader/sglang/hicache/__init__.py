"""HiCache: the host pool holding packed rows, and index copies on SGLang's CPU engine."""
