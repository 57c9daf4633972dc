"""The chief at run time: loads the program into the CS, drives train/eval/predict, writes checkpoints, summaries and logs."""
