"""A deployed pool of fixed instances (a cohort, no Auto Scaling group) looked up by name.

Before: Cls.from_name found a pool only through its Auto Scaling group; a pool whose instances were
launched as an ec2_cohort (tagged calque:pool, the worker's spec in their user-data) was "not deployed".
"""

import modal

app = modal.App("corpus-from-name-cohort")

Model = modal.Cls.from_name("parity/fixed", "Model")


@app.local_entrypoint()
def main():
    print("fixed", Model().double.remote(4), list(Model().double.map([1, 2])))
