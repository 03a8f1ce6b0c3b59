"""Everything that touches SGLang's private API: the hooks the plugin registers
(``table.py``), the start-up proof that they took (``check.py``) and the version guard. An SGLang
upgrade is checked here."""
