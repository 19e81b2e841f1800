"""One module per DVC stage (prepare, warmup, build_sft_data, train_analyzer, rl, evaluate); none imports another."""
