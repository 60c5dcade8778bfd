"""The GGUF file, read without llama.cpp: its header (``header``), the facts the
engine needs from it (``facts``), whether an MTP source fits a target
(``sidecar``), and which tensors llama.cpp's loader consumes per architecture
(``loader_tensors`` over the generated ``loader_tensors_table``).

Everything here is pure Python, so the app, the store and the doctor can check a
file before any native load (llama.cpp aborts on many mismatches)."""
