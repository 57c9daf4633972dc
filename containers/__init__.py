"""Containers: the image definition (`csrun.def`) and the Apptainer/Singularity wrapper.

`runtime.py` finds the runtime and builds the `exec` command every launcher uses;
`recipes.py` reads and converts definition files with spython
(`python -m containers check|convert`).
"""
