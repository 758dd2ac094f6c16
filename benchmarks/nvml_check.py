"""Real-GPU check of the executor and the power model (needs an NVIDIA GPU and pynvml).

Usage: python benchmarks/nvml_check.py [options]   (see --help)

Locks several SM clocks in turn under a small matmul load, measures power and
energy from NVML, restores the GPU, and prints measured vs predicted power.
Without a GPU it exits with a message saying so.
"""

from energyopt.nvml.gpucheck import main

if __name__ == "__main__":
    raise SystemExit(main())
