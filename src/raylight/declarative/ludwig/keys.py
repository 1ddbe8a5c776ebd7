"""Ludwig's config keys that raylight does not take, each with what to use instead.

A Ludwig user's config loads as it is where raylight has the same setting
(``backend.type: ray``, ``backend.trainer.{num_workers, use_gpu, resources_per_worker,
strategy}``, ``backend.processor.type: dask``, which runs on Ray Data). The keys below
have no raylight counterpart, or another spelling; each is an error naming its key path
and the fix, rather than pydantic's generic "unknown key", unless its value is what
raylight does anyway (its neutral values, Ludwig's defaults mostly): then the key is
dropped. Keys that mean nothing in raylight whatever their value (``IGNORED_KEYS``,
``IGNORED_FEATURE_KEYS``) are dropped with one warning line each. Read by ``ModelConfig``
(``ludwig.check``) before it validates anything else; docs/declarative.md tables every
key of Ludwig 0.17's schema and what raylight does with it.

This module holds the tables; ``check.py`` applies them, ``spellings.py`` translates
Ludwig's spellings of settings raylight has.
"""

from __future__ import annotations

from typing import Any

# Key path (dots between sections) -> what to do instead, and the values that do what
# raylight does anyway (Ludwig's defaults, mostly): a config that spells them out loads,
# without the key. ANY: whatever the value.
ANY = object()
# Ludwig's adafactor is Hugging Face's; raylight's is torch.optim.Adafactor, whose step is
# HF's with relative_step and scale_parameter on and no warm-up init, learning_rate capping
# the relative step.
_ADAFACTOR = (
    "raylight's adafactor is torch.optim.Adafactor: a relative step capped by the learning rate, scaled by each "
    "parameter's size (Hugging Face's relative_step: true, scale_parameter: true, warmup_init: false); remove the key"
)
LUDWIG_KEYS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "model_type": ("raylight trains Ludwig's ecd model (encoders, combiner, decoder) only; remove the key", ("ecd",)),
    "ludwig_version": ("raylight does not read it; remove the key", (ANY,)),  # which Ludwig wrote the config: nothing to do
    "preset": ("an LLM setting; remove the key", (None,)),
    "hyperopt.executor.type": ("raylight's trials run on Ray Tune; remove the key", ("ray",)),
    "hyperopt.executor.trial_driver_resources": ("a trial's driver takes no resources of its own; remove the key", (None,)),
    "hyperopt.executor.kubernetes_namespace": ("raylight runs on the Ray cluster it connects to; remove the key", (None,)),
    "hyperopt.executor.scheduler.time_attr": ("raylight's trials report once per epoch, Tune's training_iteration; remove the key", ("training_iteration",)),
    "hyperopt.executor.scheduler.metric": ("the scheduler follows hyperopt.metric; remove the key", (None,)),
    "hyperopt.executor.scheduler.mode": ("the scheduler follows hyperopt.goal; remove the key", (None,)),
    "hyperopt.executor.scheduler.brackets": ("raylight's async_hyperband has one bracket; remove the key", (1,)),
    "hyperopt.executor.scheduler.stop_last_trials": ("raylight's async_hyperband stops the last trials too; remove the key", (True,)),
    "backend.loader": (
        (
            "Ludwig's Ray Data loader settings; raylight's workers read the preprocessed blocks from "
            "the object store themselves; remove the section"
        ),
        (),
    ),
    "backend.preprocessor_kwargs": (
        (
            "preprocessing runs before training reserves any CPU and may use every CPU of the cluster; "
            "remove the section"
        ),
        (),
    ),
    "backend.credentials": (
        (
            "backend.cache_dir is read through fsspec: give credentials the fsspec way (environment "
            "variables, ~/.aws/credentials, ...); remove the section"
        ),
        (),
    ),
    "backend.cache_credentials": (
        (
            "backend.cache_dir is read through fsspec: give credentials the fsspec way (environment "
            "variables, ~/.aws/credentials, ...); remove the section"
        ),
        (),
    ),
    "backend.trainer.nics": (
        (
            "a Horovod network setting; raylight binds loopback or the node's address itself; remove "
            "the key"
        ),
        (),
    ),
    "preprocessing.global_max_sequence_length": (
        "an LLM setting; each text feature's preprocessing.max_sequence_length caps its tokens; remove the key",
        (None,),
    ),
    # Ludwig's true flattens a per-step encoder output before the layers; raylight's combiners
    # flatten every input (Encoded.size), and its other encoders give flat vectors: both values
    # do what raylight does.
    "combiner.flatten_inputs": ("raylight's combiners flatten every input's output; remove the key", (False, True)),
    "combiner.weights_initializer": (
        "raylight initialises weights xavier-uniform, Ludwig's default; remove the key", ("xavier_uniform", "glorot_uniform"),
    ),
    "combiner.bias_initializer": ("raylight initialises biases to zero, Ludwig's default; remove the key", ("zeros",)),
    "combiner.norm_params": ("raylight's normalisation takes torch's defaults; remove the key", (None, {})),
    "combiner.batch_ensemble": ("batch ensembles are not available; remove the key", (False,)),
    "combiner.num_ensemble_members": ("batch ensembles are not available; remove the key", (4,)),
    "trainer.learning_rate_scaling": (
        # Ludwig's batch_size is per worker and its linear scaling multiplies the rate by the
        # workers: the rate per sample of the global batch is the one written, as raylight's
        # global batch_size at the rate written gives.
        (
            "raylight's batch_size is global (Ludwig's is per worker), which keeps Ludwig's linear "
            "scaling of the rate to the batch; for other rules use trainer.adaptive.lr_rule with batch_size: auto"
        ),
        ("linear",),
    ),
    "trainer.max_batch_size": ("use batch_size: auto with trainer.adaptive.max_batch_size", (2**40,)),  # Ludwig's "no limit"
    "trainer.effective_batch_size": (
        "use trainer.batch_size: raylight's batch size is already global (over all workers)",
        ("auto",),
    ),
    "trainer.gradient_accumulation_steps": (
        (
            "the adaptive engine accumulates gradients when the batch outgrows a worker "
            "(trainer.adaptive.accumulation, with batch_size: auto); remove the key"
        ),
        ("auto", 1),
    ),
    "trainer.checkpoints_per_epoch": ("raylight checkpoints once per epoch; remove the key", (0, 1)),
    "trainer.skip_all_evaluation": (
        (
            "raylight evaluates the validation split once per epoch (give it no rows in "
            "preprocessing.split.probabilities to skip it); remove the key"
        ),
        (False,),
    ),
    "trainer.enable_profiling": ("not available; remove the key", (False,)),
    "trainer.profiler": (
        "not available; remove the section",
        ({}, None, {"wait": 1, "warmup": 1, "active": 3, "repeat": 5, "skip_first": 0}),  # the last: Ludwig 0.17 renders it
    ),
    "trainer.eval_steps": ("an evaluation covers the whole validation split; remove the key", (None,)),
    "trainer.should_shuffle": (
        "raylight shuffles the training split every epoch (seeded by trainer.seed); remove the key",
        (True,),
    ),
    "trainer.increase_batch_size_on_plateau": (
        "use trainer.batch_size: auto (the adaptive engine grows the batch by goodput)",
        (0,),
    ),
    "trainer.increase_batch_size_on_plateau_patience": ("use trainer.batch_size: auto; remove the key", (5,)),
    "trainer.increase_batch_size_on_plateau_rate": ("use trainer.batch_size: auto; remove the key", (2.0,)),
    "trainer.increase_batch_size_eval_metric": ("use trainer.batch_size: auto; remove the key", ("loss",)),
    "trainer.increase_batch_size_eval_split": ("use trainer.batch_size: auto; remove the key", ("training",)),
    "trainer.bucketing_field": ("raylight batches rows in a random order; remove the key", (None,)),
    "trainer.compile": ("torch.compile is not available on the declarative path; remove the key", (False,)),
    "trainer.enable_gradient_checkpointing": ("not available on the declarative path; remove the key", (False,)),
    "trainer.layers_to_freeze_regex": ("raylight trains every layer; remove the key", (None,)),
    "trainer.loss_balancing_alpha": (
        "gradnorm's asymmetry (Ludwig's famo does not read it); gradnorm is not available: remove the key", (1.5,),
    ),
    "trainer.optimizer.scale_parameter": (_ADAFACTOR, (True,)),
    "trainer.optimizer.relative_step": (_ADAFACTOR, (True,)),
    "trainer.optimizer.warmup_init": (_ADAFACTOR, (False,)),
    "trainer.contrastive_pretrain_epochs": ("contrastive pre-training is not available; remove the key", (0,)),
    "trainer.contrastive_pretrain_temperature": ("contrastive pre-training is not available; remove the key", (0.07,)),
    "trainer.contrastive_pretrain_projection_dim": ("contrastive pre-training is not available; remove the key", (128,)),
    "trainer.contrastive_pretrain_learnable_temperature": (
        "contrastive pre-training is not available; remove the key",
        (True,),
    ),
    "trainer.modality_dropout": ("not available; remove the key (combiner.dropout drops units after each layer)", (0,)),
    "trainer.model_soup": ("not available: raylight keeps the weights of the best epoch; remove the key", (None,)),
    "trainer.model_soup_top_k": ("not available: raylight keeps the weights of the best epoch; remove the key", (5,)),
}

# Ludwig's keys in an entry of fc_layers (the combiner's, a date encoder's) that raylight's
# FCLayer lacks; a date encoder's own, too.
FC_LAYER_KEYS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "weights_initializer": ("raylight initialises weights xavier-uniform, Ludwig's default; remove the key", ("xavier_uniform",)),
    "bias_initializer": ("raylight initialises biases to zero, Ludwig's default; remove the key", ("zeros",)),
    "norm_params": ("raylight's normalisation takes torch's defaults; remove the key", (None, {})),
}

# Ludwig's keys inside a feature that raylight does not take, by (input or output, the
# feature's type, or "*" for any) and key path inside the feature: what to do instead, and
# the values that do what raylight does anyway (dropped, as LUDWIG_KEYS'; a section left
# empty goes too). raylight has one encoder per input type and one loss and decoder
# per output type: Ludwig's name of each is its neutral value.
_ENCODERS = {
    "number": "raylight passes numbers through (Ludwig's passthrough encoder): use type: passthrough or remove the section",
    "binary": "raylight passes binaries through (Ludwig's passthrough encoder): use type: passthrough or remove the section",
}
_LOSSES = {
    "binary": "binary_weighted_cross_entropy", "category": "softmax_cross_entropy", "number": "mean_squared_error",
    "set": "sigmoid_cross_entropy", "vector": "mean_squared_error",
}
# Ludwig's mlp_classifier's inference settings, which raylight's decoder takes for binary and
# category outputs; the other outputs refuse them (not theirs in Ludwig either).
CLASSIFIER_ONLY = {
    "decoder.calibration": ("calibration (temperature scaling) is for binary and category outputs; remove the key", (None,)),
    "decoder.mc_dropout_samples": ("Monte Carlo dropout is for binary and category outputs; remove the key", (0,)),
}
_DECODERS = {"binary": "regressor", "category": "classifier", "number": "regressor", "set": "classifier", "vector": "projector"}


def _decoder(kind: str) -> tuple[str, tuple[Any, ...]]:
    return f"raylight's {kind} decoder is Ludwig's {_DECODERS[kind]}; use it or remove the key", (_DECODERS[kind],)


_VIT_SIZES = (
    "raylight's vit is torchvision's, sized by model_variant (b_16: hidden 768, 12 layers, 12 heads, 3072 "
    "feed-forward; l_16, l_32, h_14 larger); use model_variant instead"
)
_DEPENDENCIES = (
    "raylight's outputs do not feed one another: each output's decoder reads the combiner's output; remove the key"
)
_DECODER_FIX = "raylight initialises a decoder's layers as the combiner's (xavier-uniform, zero biases, torch's norms); remove the key"
# The settings of a decoder's layers raylight's decoder section lacks, at Ludwig's defaults.
_DECODER_FC: dict[str, tuple[Any, ...]] = {
    "weights_initializer": ("xavier_uniform",), "bias_initializer": ("zeros",), "norm_params": (None, {}),
}
# Keys Ludwig's render_config writes in every feature.
_RENDERED = {
    "active": ("raylight uses every feature in the config; remove the feature instead", (True,)),
    "proc_column": ("Ludwig's internal column name; remove the key", (ANY,)),
}
_EMBEDDING_KEYS = {
    "encoder.embeddings_trainable": ("raylight trains its embeddings; remove the key", (True,)),
    "encoder.pretrained_embeddings": ("pre-trained embeddings are not available; remove the key", (None,)),
    "encoder.embeddings_on_cpu": ("remove the key (embeddings live with the rest of the model)", (False,)),
    "encoder.dropout": ("not available on encoders; use combiner.dropout", (0,)),
}
_COMPUTED = ("Ludwig computes it from the data; remove the key", (ANY,))  # written by Ludwig's rendered configs
_OUTLIERS = {
    "preprocessing.outlier_strategy": (
        "raylight keeps a number target's outliers; clip or drop them in the dataset before training; remove the key",
        (None,),
    ),
    "preprocessing.outlier_threshold": ("raylight keeps a number target's outliers; remove the key", (3.0,)),
}
_NO_CACHE = ("raylight trains its encoders, so there are no embeddings to cache; remove the key", (False,))
_NO_PROMPT = {"template": None, "task": None, "retrieval": {"type": None, "index_name": None, "model_name": None, "k": 0}}
_MISSING_TEXT = "raylight encodes a missing text as a bag of no tokens; remove the key"
_MISSING_TARGET = "raylight drops the rows whose target is missing (Ludwig's drop_row); remove the key"
# An encoder with its own layers (date, set, bag, vector): Ludwig's keys of its FCStack.
_STACK_KEYS = {f"encoder.{key}": fix for key, fix in FC_LAYER_KEYS.items()}
# The encoders that embed tokens and take dropout (text, sequence, set, bag).
_TOKEN_EMBEDDINGS = {
    **{key: fix for key, fix in _EMBEDDING_KEYS.items() if key != "encoder.dropout"},
    "encoder.representation": ("raylight's embeddings are dense (Ludwig's sparse one-hot is not available); remove the key", ("dense",)),
    "encoder.vocab": ("raylight builds the vocabulary from the training split (most_common); remove the key", (None,)),
}
_TOKEN_BAG_KEYS = {**_TOKEN_EMBEDDINGS, **_STACK_KEYS}  # a set's and a bag's embed encoder
# A text's and a sequence's (the same encoders and tokens).
_TEXT_KEYS: dict[str, tuple[str, tuple[Any, ...]]] = {
    **_TOKEN_EMBEDDINGS,
    **_STACK_KEYS,
    "encoder.should_embed": ("raylight's text encoders embed their tokens; remove the key", (True,)),
    "encoder.max_sequence_length": ("use preprocessing.max_sequence_length", (None,)),
    # Ludwig's embed encoder starts its embeddings uniform; raylight's start xavier-uniform
    # (README): the initialiser is not a setting.
    "encoder.weights_initializer": ("raylight initialises embeddings xavier-uniform; remove the key", ("uniform", "xavier_uniform")),
    # Ludwig's rnn passes these to no layer (its cells are torch's, at torch's defaults)
    **{f"encoder.{key}": (f"raylight's rnn cells are torch's, as Ludwig's are ({key} reaches no layer in Ludwig either); remove the key", (value,))
       for key, value in (("recurrent_activation", "sigmoid"), ("unit_forget_bias", True), ("recurrent_initializer", "orthogonal"))},
    "encoder.use_rope": ("rotary position embeddings are not available: the transformer adds learned ones; remove the key", (False,)),
    "encoder.strides": ("raylight's convolutions move one step at a time; remove the key", (1,)),
    "encoder.dilation_rate": ("raylight's convolutions are not dilated; remove the key", (1,)),
    "encoder.padding": ("raylight's convolutions pad to keep the length (same); remove the key", ("same",)),
    "encoder.pool_strides": ("raylight's pooling strides by its width (pool_size); remove the key", (None,)),
    "encoder.pool_padding": ("raylight's pooling keeps the last partial window (Ludwig's same); remove the key", ("same",)),
    "preprocessing.prompt": ("prompts are an LLM setting; remove the section", (None, _NO_PROMPT)),
    "preprocessing.pretrained_model_name_or_path": ("pre-trained tokenizers are not available; use preprocessing.tokenizer", (None,)),
    "preprocessing.vocab_file": ("raylight builds the vocabulary from the training split (most_common, min_frequency); remove the key", (None,)),
    "preprocessing.sequence_length": (
        "raylight keeps each row's first max_sequence_length tokens, padded to that: use preprocessing.max_sequence_length",
        (None,),
    ),
    "preprocessing.padding_symbol": ("raylight's padding is its own; remove the key", ("<PAD>",)),
    "preprocessing.unknown_symbol": ("raylight's unknown token is its own; remove the key", ("<UNK>",)),
    "preprocessing.padding": ("raylight pads on the right, Ludwig's default; remove the key", ("right",)),
    "preprocessing.missing_value_strategy": (_MISSING_TEXT, ("fill_with_const",)),
    "preprocessing.fill_value": (_MISSING_TEXT, ("<UNK>",)),
    "preprocessing.ngram_size": ("raylight does not form n-grams; remove the key", (2,)),
    "preprocessing.compute_idf": ("raylight does not weight tokens by IDF; remove the key", (False,)),
    "preprocessing.cache_encoder_embeddings": _NO_CACHE,
}
FEATURE_KEYS: dict[tuple[str, str], dict[str, tuple[str, tuple[Any, ...]]]] = {
    ("input", "number"): {
        "encoder.type": (_ENCODERS["number"], ("passthrough",)),
        "preprocessing.computed_outlier_fill_value": _COMPUTED,
    },
    ("input", "binary"): {
        "encoder.type": (_ENCODERS["binary"], ("passthrough",)),
        "preprocessing.fallback_true_label": (
            "raylight reads 1, true, yes, y, t and on (any case) as true and anything else as false; "
            "map the column's values to those; remove the key",
            (None,),
        ),
        "preprocessing.fill_value": (
            "raylight fills a missing binary with false (missing_value_strategy: fill_with_false); remove the key",
            (None, False),
        ),
    },
    ("input", "category"): {
        **_EMBEDDING_KEYS,
        "encoder.vocab": ("raylight builds the vocabulary from the training split; remove the key", (None,)),
        "encoder.embedding_initializer": ("raylight initialises embeddings xavier-uniform; remove the key", (None,)),
        "preprocessing.lowercase": ("raylight keeps a category's case; lower-case the column before training; remove the key", (False,)),
        "preprocessing.cache_encoder_embeddings": _NO_CACHE,
    },
    ("input", "sequence"): _TEXT_KEYS,
    ("input", "timeseries"): {
        **{key: fix for key, fix in _TEXT_KEYS.items() if key.startswith("encoder.")},
        # Ludwig writes should_embed: true, and its timeseries feature sets it false
        "encoder.should_embed": ("raylight's timeseries encoder takes the numbers as they are; remove the key", (True, False)),
        "preprocessing.window_size": ("raylight takes each row's series as it is (no sliding window); remove the key", (0,)),
        "preprocessing.cache_encoder_embeddings": _NO_CACHE,
    },
    ("input", "text"): _TEXT_KEYS,
    ("input", "date"): {"encoder.embeddings_on_cpu": _EMBEDDING_KEYS["encoder.embeddings_on_cpu"], **_STACK_KEYS},
    ("input", "set"): _TOKEN_BAG_KEYS,
    ("input", "bag"): _TOKEN_BAG_KEYS,
    ("input", "vector"): {"encoder.input_size": _COMPUTED, **_STACK_KEYS},
    ("input", "image"): {
        **{f"encoder.{key}": ("the image's size and channels are preprocessing's (height, width, num_channels); remove the key", (None,))
           for key in ("height", "width", "num_channels")},
        # Ludwig's Hugging Face ViT's sizes (its insurance_lite example): raylight's vit is
        # torchvision's, sized by model_variant; b_16's are neutral.
        **{f"encoder.{key}": (_VIT_SIZES, (value,)) for key, value in (
            ("hidden_size", 768), ("num_hidden_layers", 12), ("num_attention_heads", 12), ("intermediate_size", 3072),
        )},
        "encoder.conv_norm_params": FC_LAYER_KEYS["norm_params"],
        "encoder.fc_norm_params": FC_LAYER_KEYS["norm_params"],
        "encoder.fc_weights_initializer": FC_LAYER_KEYS["weights_initializer"],
        "encoder.fc_bias_initializer": FC_LAYER_KEYS["bias_initializer"],
        "encoder.saved_weights_in_checkpoint": ("raylight saves every weight with the model; remove the key", (False, True)),
        "encoder.model_cache_dir": ("raylight downloads no weights; remove the key", (None,)),
        "augmentation": ("image augmentation is not available; remove the key", (False, None, [])),
        "preprocessing.in_memory": ("raylight decodes every image at preprocessing and keeps them in memory; remove the key", (True,)),
        "preprocessing.mode": (
            "raylight decodes every image once, at preprocessing (Ludwig's eager mode); remove the key", ("lazy", "eager", "lazy_cached"),
        ),
        "preprocessing.prefetch_size": ("raylight decodes every image at preprocessing; remove the key", (None,)),
        "preprocessing.lazy_cache_dir": ("raylight decodes every image at preprocessing; remove the key", (None,)),
        "preprocessing.num_processes": ("raylight decodes the images in one process per block; remove the key", (ANY,)),
        "preprocessing.num_classes": ("channel classes (image segmentation) are not available; remove the key", (None,)),
        "preprocessing.infer_image_num_classes": ("channel classes (image segmentation) are not available; remove the key", (False,)),
    },
    ("input", "*"): {
        "tied": ("raylight does not share encoders between features; remove the key", (None,)),
        "preprocessing.computed_fill_value": _COMPUTED,
        **_RENDERED,
        "encoder.skip": ("raylight encodes every input; remove the key", (False,)),
        "encoder.adapter": ("adapters are an LLM setting; remove the key", (None,)),
    },
    ("output", "binary"): {
        "loss.type": (f"raylight's binary loss is Ludwig's {_LOSSES['binary']}; use it or remove the key", (_LOSSES["binary"],)),
        "decoder.type": _decoder("binary"),
        "loss.positive_class_weight": ("class weights are not available; remove the key", (None,)),
        "preprocessing.fallback_true_label": (
            "raylight reads 1, true, yes, y, t and on (any case) as true and anything else as false; remove the key",
            (None,),
        ),
    },
    ("output", "category"): {
        "decoder.type": _decoder("category"),
        "loss.class_weights": ("class weights are not available; remove the key", (None,)),
        "loss.class_similarities": ("class similarities are not available; remove the key", (None,)),
        "loss.class_similarities_temperature": ("class similarities are not available; remove the key", (0,)),
        "preprocessing.lowercase": ("raylight keeps the classes' case; lower-case the column before training; remove the key", (False,)),
        "preprocessing.most_common": ("raylight keeps every class of the target; remove the key", (10000,)),
    },
    ("output", "number"): {
        **CLASSIFIER_ONLY,
        "loss.type": (f"raylight's number loss is Ludwig's {_LOSSES['number']}; use it or remove the key", (_LOSSES["number"],)),
        "decoder.type": _decoder("number"),
        "clip": ("raylight does not clip predictions; remove the key", (None,)),
        "preprocessing.normalization": (
            "raylight trains on the target scaled by the training split's mean and deviation and "
            "reports in the column's units; remove the key",
            (None, "zscore"),
        ),
        **_OUTLIERS,
        "preprocessing.computed_outlier_fill_value": _COMPUTED,
    },
    ("output", "set"): {
        **CLASSIFIER_ONLY,
        "loss.type": (f"raylight's set loss is Ludwig's {_LOSSES['set']}; use it or remove the key", (_LOSSES["set"],)),
        "decoder.type": _decoder("set"),
        "loss.class_weights": ("class weights are not available; remove the key", (None,)),
        "preprocessing.tokenizer": (
            "a set target's labels are separated by white space (Ludwig's space tokenizer); write them so; remove the key",
            ("space",),
        ),
        "preprocessing.lowercase": ("raylight keeps the labels' case; lower-case the column before training; remove the key", (False,)),
        "preprocessing.most_common": ("raylight keeps the 10,000 most common labels, Ludwig's default; remove the key", (10000,)),
    },
    ("output", "vector"): {
        **CLASSIFIER_ONLY,
        "loss.type": (f"raylight's vector loss is Ludwig's {_LOSSES['vector']}; use it or remove the key", (_LOSSES["vector"],)),
        "decoder.type": _decoder("vector"),
        "decoder.output_size": _COMPUTED,
        "decoder.activation": ("raylight's projector gives the floats as they are (no activation); remove the key", (None,)),
        "decoder.multiplier": ("raylight's projector does not scale its floats; remove the key", (1.0, 1)),
        "decoder.clip": ("raylight does not clip predictions; remove the key", (None,)),
        "softmax": ("Ludwig 0.17 applies no softmax to a vector output either; remove the key", (False,)),
        "preprocessing.vector_size": ("write it as the output's vector_size", (None,)),
    },
    ("output", "timeseries"): {
        **CLASSIFIER_ONLY,
        "decoder.type": ("raylight's timeseries decoder is Ludwig's projector; use it or remove the key", ("projector",)),
        "decoder.output_size": _COMPUTED,
        "decoder.activation": ("raylight's projector gives the values as they are (no activation); remove the key", (None,)),
        "decoder.multiplier": ("raylight's projector does not scale its values; remove the key", (1.0, 1)),
        "decoder.clip": ("raylight does not clip predictions; remove the key", (None,)),
        "preprocessing.horizon": (
            "raylight reads each row's series of future values as it is (no sliding window over a column); set the "
            "output's horizon, or remove the key",
            (0,),
        ),
    },
    ("output", "anomaly"): {
        "decoder.type": ("raylight's anomaly decoder is Ludwig's anomaly decoder (the distance from the center); use it or remove the key", ("anomaly",)),
    },
    ("output", "*"): {
        "loss.robust_lambda": ("not available; remove the key", (0,)),
        "loss.confidence_penalty": ("not available; remove the key", (0,)),
        "reduce_input": ("raylight's combiner gives one vector: nothing to reduce; remove the key", ("sum", None)),
        "dependencies": (_DEPENDENCIES, ([],)),
        "reduce_dependencies": (_DEPENDENCIES, ("sum", None)),
        **_RENDERED,
        "default_validation_metric": ("trainer.validation_metric chooses the metric; remove the key", (ANY,)),
        "input_size": _COMPUTED,
        "num_classes": _COMPUTED,
        "preprocessing.cache_encoder_embeddings": _NO_CACHE,
        "decoder.input_size": _COMPUTED,
        "decoder.num_classes": _COMPUTED,
        "decoder.use_bias": ("raylight's decoder has a bias; remove the key", (True,)),
        "decoder.weights_initializer": ("raylight initialises weights xavier-uniform, Ludwig's default; remove the key", ("xavier_uniform",)),
        "decoder.bias_initializer": ("raylight initialises biases to zero, Ludwig's default; remove the key", ("zeros",)),
        **{f"decoder.fc_{key}": (_DECODER_FIX, neutral) for key, neutral in _DECODER_FC.items()},
        "preprocessing.missing_value_strategy": (_MISSING_TARGET, ("drop_row",)),
        "preprocessing.fill_value": (_MISSING_TARGET, (ANY,)),  # drop_row never fills
        "preprocessing.computed_fill_value": _COMPUTED,
    },
}

_OPTIMIZERS = "adam, adamw, radam, sgd, adadelta, adagrad, adamax, nadam, rmsprop, adafactor, muon, schedule_free_adamw or lbfgs"
# Values of raylight's keys that are Ludwig's only, by key path: what to do instead.
LUDWIG_VALUES: dict[tuple[str, str], str] = {
    **{
        ("trainer.optimizer.type", name): (
            f"Ludwig's {name} optimizer needs bitsandbytes (GPUs), which raylight does not use; use {_OPTIMIZERS}"
        )
        for name in (
            "sgd_8bit", "adam_8bit", "paged_adam", "paged_adam_8bit", "adamw_8bit", "paged_adamw", "paged_adamw_8bit",
            "adagrad_8bit", "rmsprop_8bit", "lamb", "lamb_8bit", "lars", "lars_8bit", "lion", "lion_8bit",
            "paged_lion", "paged_lion_8bit",
        )
    },
    **{
        ("trainer.optimizer.type", name): f"Ludwig's {name} optimizer is not available; use {_OPTIMIZERS}"
        for name in ("soap",)
    },
    ("trainer.loss_balancing", "gradnorm"): (
        "Ludwig's gradnorm is not available; use none, log_transform, uncertainty, famo, nash_mtl or pareto_mtl"
    ),
    ("backend.processor.type", "modin"): "Ludwig's modin processor is not available: use auto, pandas (in the driver) or ray_data",
    ("backend.processor.type", "spark"): "Ludwig's spark processor is not available: use auto, pandas (in the driver) or ray_data",
}

# Ludwig 0.17's combiner types (ludwig/schema/combiners/): one raylight lacks is refused
# with the types raylight has (``check._combiner_type``), these named as Ludwig's.
LUDWIG_COMBINERS = (
    "concat", "sequence_concat", "sequence", "tabnet", "comparator", "transformer", "tabtransformer", "ft_transformer",
    "project_aggregate", "gated_fusion", "cross_attention", "perceiver", "hypernetwork", "tabpfn_v2",
)

# Ludwig 0.17's encoder types raylight lacks for a feature type other than image (refused
# at encoder.type, ``check._encoder_type``, the section's other keys with it), by feature type.
LUDWIG_ENCODER_TYPES: dict[str, dict[str, str]] = {
    "category": {
        "passthrough": "Ludwig's passthrough category encoder feeds the category's index to the combiner as a number, "
        "which raylight does not; use dense (a trained embedding), sparse or onehot (a one-hot vector of the vocabulary)",
    },
}

# Ludwig 0.17's image encoders raylight lacks, each built around downloaded weights
# (torchvision's, Hugging Face's, timm's; unet: segmentation): refused at encoder.type
# (``check._encoder_type``), the section's other keys with it.
LUDWIG_IMAGE_ENCODERS = (
    "alexnet", "caformer", "clip", "convformer", "convnext", "convnextv2", "densenet", "dinov2", "efficientnet",
    "googlenet", "inceptionv3", "maxvit", "mnasnet", "mobilenetv2", "mobilenetv3", "poolformer", "regnet", "resnext",
    "shufflenet_v2", "siglip", "squeezenet", "swin_transformer", "timm", "unet", "vgg", "wide_resnet",
)

# Ludwig's keys that mean nothing in raylight whatever their value: dropped, each with one
# warning line saying so (its note), by key path.
_PARTITIONS = (
    "Ludwig's Dask partitions; raylight sizes its Ray Data blocks itself (one task per block, as many blocks as "
    "CPUs, each of at least 20,000 rows)"
)
_NOT_IN_SCHEMA = "not a key of Ludwig 0.17's schema either (Ludwig drops it with a warning)"
IGNORED_KEYS: dict[str, str] = {
    "backend.processor.parallelism": _PARTITIONS,
    "backend.processor.persist": (
        "preprocessed blocks always stay in Ray's object store for the run (backend.cache_dir keeps them across runs)"
    ),
    "trainer.learning_rate_scheduler.type": (
        f"{_NOT_IN_SCHEMA}, so the rate follows decay (null: constant), as here; set decay (linear, exponential, "
        "cosine, ...) for a decay"
    ),
    # Ludwig's TensorFlow-era tabnet: bn_virtual_bs / batch_size; Ludwig 0.17 takes bn_virtual_bs only.
    "combiner.bn_virtual_divider": f"{_NOT_IN_SCHEMA}; combiner.bn_virtual_bs sets the ghost batch size",
    # when checkpoints are written, not what trains: raylight's run directory keeps one per epoch
    "trainer.steps_per_checkpoint": "raylight checkpoints once per epoch (and at the last step of trainer.train_steps)",
}
# The same, inside a feature, by (input or output, the feature's type or "*") and key path
# inside the feature.
_GENERATED = (
    f"a hint of Ludwig's test helpers for generating data, {_NOT_IN_SCHEMA}; raylight takes the vocabulary and "
    "lengths from the data (preprocessing.most_common, max_sequence_length)"
)
_WINDOW = (
    f"a timeseries feature's window_size, {_NOT_IN_SCHEMA}; each row's series is taken as it is (Ludwig's "
    "preprocessing.window_size, a sliding window over one column, is not available)"
)
IGNORED_FEATURE_KEYS: dict[tuple[str, str], dict[str, str]] = {
    ("input", "*"): {"encoder.vocab_size": _GENERATED, "encoder.max_len": _GENERATED, "encoder.min_len": _GENERATED},
    ("input", "timeseries"): {"window_size": _WINDOW},
    ("output", "timeseries"): {"window_size": _WINDOW + "; the output's horizon sets how many values it predicts"},
    ("output", "*"): {
        "decoder.vocab_size": _GENERATED,
        "decoder.max_len": _GENERATED,
        # Ludwig's TensorFlow-era key; Ludwig 0.17 regularises through trainer.regularization_type / _lambda.
        "weight_regularization": f"{_NOT_IN_SCHEMA}; set trainer.regularization_type and regularization_lambda",
    },
}
