"""What the user touches: the CLIs (`csrun_cpu`, `csrun_wse`, `cs_input_analyzer`) and the
user API (`CSEstimator`, `run_flow`, `run_utils`, params and site configuration)."""
