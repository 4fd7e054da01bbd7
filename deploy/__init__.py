"""How gpuledger runs: the `gpuledger` command, the server process and the demo."""
