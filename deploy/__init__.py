"""The processes: the `gpuledger` CLI, the server (API, collection, weekly report), the demo and the dashboard process."""
