"""The declarative ``hyperopt:`` section translated into Ray Tune objects: search
spaces, the search algorithm, the scheduler. No cluster is touched here."""

from __future__ import annotations

from typing import Any

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.hyperopt import (
    AshaScheduler,
    HyperoptConfig,
    MedianStoppingScheduler,
    PbtScheduler,
)

# Trials report once per epoch; Tune counts reports as training iterations.
TIME_ATTR = "training_iteration"


def tune_space(space: Any) -> Any:
    """One parameter's space as a Ray Tune domain (or grid_search)."""
    from ray import tune

    if space.space == "choice":
        return tune.choice(list(space.categories))
    if space.space == "grid":
        return tune.grid_search(list(space.values))
    if space.space == "uniform":
        return tune.uniform(space.lower, space.upper)
    if space.space == "loguniform":
        return tune.loguniform(space.lower, space.upper)
    if space.space == "randint":
        return tune.randint(space.lower, space.upper)
    raise AssertionError(f"unknown space {space.space}")  # the schema allows no other


def param_space(h: HyperoptConfig) -> dict[str, Any]:
    """Tune's param_space: one flat key per dotted config path."""
    return {key: tune_space(space) for key, space in h.parameters.items()}


def num_trials(h: HyperoptConfig) -> int:
    """How many trials the search runs: num_samples, times the grid's size."""
    grid = 1
    for space in h.parameters.values():
        if space.space == "grid":
            grid *= len(space.values)
    if h.search_alg.type == "grid":
        for space in h.parameters.values():
            if space.space == "choice":
                grid *= len(space.categories)
    return h.executor.num_samples * grid


def mode(h: HyperoptConfig) -> str:
    return "min" if h.goal == "minimize" else "max"


def search_space_for(h: HyperoptConfig) -> dict[str, Any]:
    """The param_space given to the Tuner: for search_alg grid, choices become grids."""
    from ray import tune

    space = param_space(h)
    if h.search_alg.type == "grid":
        for key, s in h.parameters.items():
            if s.space == "choice":
                space[key] = tune.grid_search(list(s.categories))
    return space


def search_algorithm(h: HyperoptConfig, max_concurrent: int = 0) -> Any:
    """The search algorithm, holding the trials-at-once limit itself (``max_concurrent``,
    0: none): Tune's random/grid variant generator (seeded where ``search_alg.seed`` is
    given) or an Optuna searcher behind a ``ConcurrencyLimiter``.

    The limit lives here, and the TuneConfig's ``max_concurrent_trials`` stays unset: Tune
    applies that one only to a ``Searcher`` or where it builds the generator itself; given a
    seeded generator (a ``SearchAlgorithm``) it warned "max_concurrent_trials will be
    ignored" and ran every trial the cluster could place, not the resource plan's number."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if h.search_alg.type != "optuna":
        seed = h.search_alg.seed if h.search_alg.type == "random" else None
        return BasicVariantGenerator(random_state=seed, max_concurrent=max_concurrent)
    try:
        import optuna
        from ray.tune.search.optuna import OptunaSearch
    except ImportError:
        raise ConfigError(
            "hyperopt.search_alg.type: optuna needs the optuna package (pip install optuna); "
            "or use random or grid"
        ) from None
    import optuna

    sampler = optuna.samplers.TPESampler(seed=h.search_alg.seed)
    searcher = OptunaSearch(sampler=sampler)  # metric and mode come from the TuneConfig
    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent) if max_concurrent > 0 else searcher


def scheduler(h: HyperoptConfig) -> Any:
    """The Tune scheduler; metric and mode are given to the TuneConfig, not here."""
    from ray.tune import schedulers

    s = h.executor.scheduler
    if isinstance(s, AshaScheduler):
        return schedulers.ASHAScheduler(
            time_attr=TIME_ATTR, max_t=s.max_t, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if isinstance(s, MedianStoppingScheduler):
        return schedulers.MedianStoppingRule(
            time_attr=TIME_ATTR, grace_period=s.grace_period, min_samples_required=s.min_samples_required
        )
    if isinstance(s, PbtScheduler):
        return schedulers.PopulationBasedTraining(
            time_attr=TIME_ATTR,
            perturbation_interval=s.perturbation_interval,
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            hyperparam_mutations=param_space(h),
        )
    return schedulers.FIFOScheduler()
