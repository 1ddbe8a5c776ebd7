"""The cluster-wide goodput scheduler: one detached Ray actor that many runs share.

``state.py`` is its bookkeeping (registered jobs, their latest models as plain data,
who is stale), with no Ray; ``actor.py`` is the actor and the helpers that start, find
and stop it. The sharing math is ``raylight.adaptive.sharing`` (Pollux's cluster half).
"""
