"""The key names of Ludwig 0.17's feature sections, of every type and encoder, decoder or
loss together: read from the fields of the config classes under ``ludwig/schema/``
(github.com/ludwig-ai/ludwig at 5d19f3e, Ludwig 0.17.8; Apache-2.0). A key a raylight
section does not take but Ludwig's does is told as Ludwig's, not as a misspelling
(``errors.py``). Names only: what raylight does with each is in docs/declarative.md."""

from __future__ import annotations

LUDWIG_SECTION_KEYS: dict[str, frozenset[str]] = {
    "feature": frozenset({
        "active", "augmentation", "calibration", "class_similarities", "clip", "column", "decoder",
        "default_validation_metric", "dependencies", "encoder", "horizon", "input_size", "loss",
        "name", "num_classes", "preprocessing", "proc_column", "reduce_dependencies",
        "reduce_input", "softmax", "threshold", "threshold_percentile", "tied", "top_k",
        "vector_size"
    }),
    "encoder": frozenset({
        "activation", "activation_function", "adapter", "add_pooling_layer", "afn", "asm",
        "attention_dropout", "attention_every_k", "attention_probs_dropout_prob",
        "attention_window", "attn_pdrop", "attn_type", "avg_pool", "base_model", "bi_data",
        "bias_initializer", "bidirectional", "bins_bin_edges", "bos_index", "bos_token_id",
        "causal", "cell_type", "channel_dim", "clamp_len", "classifier_dropout",
        "classifier_dropout_prob", "conv_activation", "conv_dropout", "conv_layers", "conv_norm",
        "conv_norm_params", "conv_use_bias", "d_conv", "d_ff", "d_inner", "d_kv", "d_model",
        "d_state", "decoder_start_token_id", "dilation", "dilation_rate", "dim", "dropout",
        "dropout_rate", "emb_dim", "embd_pdrop", "embed_init_std", "embed_size",
        "embedding_initializer", "embedding_size", "embeddings_on_cpu", "embeddings_trainable",
        "encoding_size", "end_n_top", "eos_index", "eos_token_id", "expand_factor", "fc_activation",
        "fc_bias_initializer", "fc_dropout", "fc_layers", "fc_norm", "fc_norm_params",
        "fc_use_bias", "fc_weights_initializer", "feed_forward_proj", "ff_activation", "ffn_dim",
        "ffn_size", "filter_size", "force_embedding_size", "gelu_activation",
        "gradient_checkpointing", "groups", "height", "hidden_act", "hidden_dim",
        "hidden_dropout_prob", "hidden_size", "init_std", "initializer_factor", "initializer_range",
        "inner_group_num", "input_size", "intermediate_size", "is_encoder", "is_encoder_decoder",
        "kernel_size", "lang_id", "layer_norm_eps", "layer_norm_epsilon", "layer_size",
        "mask_index", "mask_token_id", "max_df", "max_position_embeddings",
        "max_relative_positions", "max_sequence_length", "mem_len", "min_df", "model_cache_dir",
        "model_name", "model_parameters", "model_type", "model_variant", "n_ctx", "n_embd",
        "n_head", "n_heads", "n_inner", "n_langs", "n_layer", "n_layers", "n_positions",
        "ngram_range", "norm", "norm_params", "norm_rel_ebd", "num_attention_heads", "num_bins",
        "num_blocks", "num_channels", "num_conv_layers", "num_decoder_layers", "num_fc_layers",
        "num_filters", "num_frequencies", "num_hash_buckets", "num_heads", "num_hidden_groups",
        "num_hidden_layers", "num_layers", "num_rec_layers", "num_stacked_layers", "num_stacks",
        "out_channels", "output_size", "pad_index", "pad_token_id", "padding", "padding_mode",
        "patch_size", "patch_stride", "ple_bin_edges", "pool_dilation", "pool_function",
        "pool_kernel_size", "pool_padding", "pool_size", "pool_stride", "pool_strides",
        "pooler_dropout", "pooler_hidden_act", "pooler_hidden_size", "pos_att_type",
        "position_biased_input", "position_buckets", "position_embedding_type",
        "pretrained_embeddings", "pretrained_kwargs", "pretrained_model_name_or_path", "qa_dropout",
        "quantization", "recurrent_activation", "recurrent_dropout", "recurrent_initializer",
        "reduce_output", "relative_attention", "relative_attention_num_buckets", "representation",
        "resid_pdrop", "reuse_len", "same_length", "saved_weights_in_checkpoint",
        "scale_attn_weights", "sep_token_id", "seq_classif_dropout", "share_att_key",
        "should_embed", "should_softmax", "sigma", "sinusoidal_embeddings", "sinusoidal_pos_embds",
        "skip", "stacked_layers", "start_n_top", "state_size", "str2idf", "stride", "strides",
        "summary_activation", "summary_last_dropout", "summary_type", "summary_use_proj",
        "tie_word_embeddings", "token_size", "tokenizer_class", "trainable",
        "transformer_output_size", "type_vocab_size", "unit_forget_bias", "unk_index", "untie_r",
        "use_bias", "use_cache", "use_lang_emb", "use_mems_eval", "use_mems_train",
        "use_pretrained", "use_rope", "vocab", "vocab_size", "weights_initializer", "width"
    }),
    "decoder": frozenset({
        "activation", "attention_embedding_size", "attention_num_heads", "beam_length_penalty",
        "beam_width", "bias_initializer", "calibration", "cell_type", "clip",
        "constrain_to_vocabulary", "conv_norm", "d_model", "dropout", "fallback_label",
        "fc_activation", "fc_bias_initializer", "fc_dropout", "fc_layers", "fc_norm",
        "fc_norm_params", "fc_output_size", "fc_use_bias", "fc_weights_initializer", "ffn_size",
        "height", "hidden_size", "input_size", "match", "match_strategy", "max_new_tokens",
        "max_sequence_length", "mc_dropout_samples", "multiplier", "num_channels", "num_classes",
        "num_fc_layers", "num_heads", "num_layers", "num_levels", "num_stages", "output_size",
        "pretrained_model_name_or_path", "reduce_input", "str2idx", "teacher_forcing_decay",
        "teacher_forcing_decay_rate", "tokenizer", "use_attention", "use_bias", "vocab_file",
        "vocab_size", "weights_initializer", "width"
    }),
    "loss": frozenset({
        "alpha", "background_class", "class_similarities", "class_similarities_temperature",
        "class_weights", "confidence_penalty", "delta", "epsilon", "eta", "gamma", "nu",
        "num_perturbation_steps", "perturbation_strength", "positive_class_weight", "robust_lambda",
        "smooth", "temperature", "unique", "weight", "xi", "zeta"
    }),
    "preprocessing": frozenset({
        "audio_file_length_limit_in_s", "cache_encoder_embeddings", "compute_idf",
        "computed_fill_value", "computed_outlier_fill_value", "datetime_format", "fallback_label",
        "fallback_true_label", "fill_value", "height", "horizon", "in_memory",
        "infer_image_dimensions", "infer_image_max_height", "infer_image_max_width",
        "infer_image_num_channels", "infer_image_num_classes", "infer_image_sample_size",
        "lazy_cache_dir", "lowercase", "max_sequence_length", "missing_value_strategy", "mode",
        "most_common", "ngram_size", "norm", "normalization", "num_channels", "num_classes",
        "num_fft_points", "num_filter_bands", "num_processes", "outlier_strategy",
        "outlier_threshold", "padding", "padding_symbol", "padding_value", "prefetch_size",
        "pretrained_model_name_or_path", "prompt", "requires_equal_dimensions", "resize_method",
        "sequence_length", "standardize_image", "timeseries_length_limit", "tokenizer",
        "unknown_symbol", "vector_size", "vocab", "vocab_file", "width", "window_length_in_s",
        "window_shift_in_s", "window_size", "window_type"
    }),
}
