"""Framework adapters: verl (JSONL tailer, trainer hooks), Hugging Face and Lightning callbacks."""
