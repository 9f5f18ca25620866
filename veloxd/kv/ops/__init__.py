"""Building blocks shared by the cache methods: blockwise attention, token-axis packing, bit
packing, the randomized Hadamard rotation, TurboQuant codebooks and their packed levels."""
