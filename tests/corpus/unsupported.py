"""A construct the worker cannot honour (a Sandbox at import): refused at load with its line."""

import modal

app = modal.App("sandbox")
sb = modal.Sandbox.create("bash", app=app)
