"""The declarative product's config, one module per section: ``features`` (inputs and
outputs), ``trainer``, ``preprocessing``, ``backend``, ``hyperopt``; ``model`` holds
``ModelConfig``, which puts them together and checks across them; ``parameters`` sets and
checks hyperparameter search's key paths. Schema only: Ludwig's spellings are
``raylight.declarative.ludwig``'s."""
