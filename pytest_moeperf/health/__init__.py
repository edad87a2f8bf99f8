"""The health gate: was the host (and the GPU) quiet while a test measured?"""
