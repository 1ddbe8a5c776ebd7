"""The ``import adaptdl`` hook that raylight.adaptdl and `raylight run`'s bootstrap share."""
