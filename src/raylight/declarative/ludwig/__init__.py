"""Ludwig's config, as raylight reads it: the keys it does not take (``keys.py``, applied
by ``check.py``) and the spellings it translates (``spellings.py``)."""
