"""The worker process that owns llama.cpp, and its versioned line protocol."""
