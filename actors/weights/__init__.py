"""Getting the learner's weights into every generator replica's vLLM, in place: the ends of each path that need
torch, the collective paths, and the load that every path shares. The ZeroMQ channel itself is core.weights.

| path (`transport.weights_sync`) | learner rank 0's end | a replica's end | runs where |
|---|---|---|---|
| `zmq`: TCP star or relay, same-node shared memory | `publication` over core.weights.publisher | `generator_end` (core.weights.subscriber) | the generator actor's process, then its vLLM worker(s) |
| `collective`: NCCL on GPUs, gloo on CPU | `group_publisher` | `group_generator` + `group_subscriber` (control), the vLLM worker(s) join `group` (data) | rank 0's process and each vLLM worker |
| `collective` with CUDA IPC (every worker sees rank 0's GPU) | `group_publisher` + `cuda_ipc` | the vLLM worker(s), `cuda_ipc` | the same |

| module | what it is |
|---|---|
| `publication` | publishing each version from the learner, acks followed in the background |
| `generator_end` | a replica's end of the ZeroMQ channel: check a version against the checkpoint, stage it, hand it to vLLM |
| `vllm_worker` | the worker extension that takes a staged (or broadcast) version inside vLLM's worker process(es) |
| `vllm_load` | the in-place copy into vLLM's parameters: a name map built once, then copies (every path's last layer) |
| `group` | the weights group (NCCL or gloo): membership, a version's announcement, broadcasts waited on against a deadline |
| `group_buckets` | a version through the group in bounded buckets, two buffers a side, every wait against a deadline |
| `group_publisher` | rank 0's end of the group, with the ZeroMQ publisher's interface |
| `group_subscriber` | a replica's control end of the group: announcements in, acks out |
| `group_generator` | a replica's part in each announced version, loaded in place like the ZeroMQ path |
| `cuda_ipc` | CUDA IPC handles in place of a broadcast when every worker sees rank 0's GPU |
"""
