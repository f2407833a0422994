"""The weights channel over ZeroMQ: learner rank 0 publishes each version, every generator replica receives it.

The paths a version can take, and where each end runs (the collective paths, NCCL/gloo and CUDA IPC, are in
actors.weights: they need torch):

| path | publisher end (learner rank 0) | subscriber end (a generator replica) | layers it goes through |
|---|---|---|---|
| TCP star: every chunk to every replica | `publisher.WeightPublisher`, fanout `star` | `subscriber.WeightSubscriber` | tensors, control, seal*, assembly |
| TCP relay chain: each chunk once, replica to replica | `publisher` + `relay.RelayFanout` (links the chain) | `subscriber` + `forward.Forwarder` (forwards) | tensors, control, seal* or digests, assembly |
| same-node shared memory | `publisher` + `shm.Shelf` (the shelf) | `subscriber`, which reads the shelf (`shm`) | tensors, shm |

(* under the run's keys with `transport.cipher=aes-gcm`; `curvezmq` encrypts the sockets instead.)

| module | what it is |
|---|---|
| `tensors` | `TensorBytes`, `WeightSet`, the dtypes carried, and the chunking of a version into bounded messages |
| `control` | the control messages (hello, K, ack, progress, link), each checked on decode; relay chunk digests |
| `seal` | AES-256-GCM sealing: chunks under a key per version, control messages per subscriber incarnation |
| `assembly` | a version's buffers, filled chunk by chunk, every header checked before anything is allocated |
| `peers` | the publisher's control plane: admission, hellos and the K messages owed, acks, flood-bounded control reads |
| `publisher` | the publisher's data plane, on `peers`: a version's chunks, the shelf, the star fan-out, the acks awaited |
| `relay` | the publisher's side of a relay chain: linking, progress, re-linking around a lost member |
| `forward` | the subscriber's side of a relay hop: its inbound socket and the forwarding to its successor |
| `subscriber` | the subscriber: authenticity before order, versions never going back, hand-out of complete versions |
| `shm` | the same-node shelf in shared memory, and the staging of a version for the in-place load |

Nothing here imports torch or anything above core; no module here imports one that imports it back.
"""
