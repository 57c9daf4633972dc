"""The wafer model shared by the compiler and the simulator: the kernel library (forward,
backward, cost), the training rules (optimizers, gradient transforms, regularizers), the
fabric and its timing model. numpy and the CS API's messages (`cs_api`): never TensorFlow."""
