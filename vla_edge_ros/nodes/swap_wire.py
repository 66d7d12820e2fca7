"""The swap service's messages (vla_edge_interfaces/srv/Swap) <-> core/swap_protocol.py's answers.

The reconciler fills a Swap response from its `SwapAnswer`; the reasoning node
turns the response back into one, refusing a response that breaks the
protocol (SwapProtocolError, which the node logs and survives). The CUDA IPC
descriptor of an offer's KV (model/cuda_ipc.py's dict) travels as a
KvIpcHandle, at most one per response.
"""
from __future__ import annotations

from ..core.swap_protocol import SwapAnswer, SwapOffer, SwapProtocolError
from .interfaces import KvIpcHandle, Swap

IPC_HANDLE_BYTES = 64         # a cuIpcMemHandle


def fill_response(answer: SwapAnswer, response: Swap.Response) -> Swap.Response:
    """The reconciler's answer into the service response."""
    offer = answer.offer
    response.offered = offer is not None
    response.reason = answer.reason
    if offer is not None:
        response.version, response.round = offer.version, offer.round
        response.path, response.frames, response.newest_frame_id = offer.path, offer.frames, offer.newest_frame_id
        response.kv = [] if offer.kv is None else [kv_handle_msg(offer.kv)]
    return response


def answer_from_response(response: Swap.Response) -> SwapAnswer:
    """The service response back into an answer; SwapProtocolError when it offers something unusable."""
    if not response.offered:
        return SwapAnswer(reason=response.reason)
    kv = kv_descriptor(response.kv[0]) if response.kv else None
    return SwapAnswer(SwapOffer(version=int(response.version), path=response.path, frames=int(response.frames),
                                newest_frame_id=int(response.newest_frame_id), kv=kv, round=int(response.round)))


def kv_handle_msg(descriptor: dict) -> KvIpcHandle:
    handle = bytes.fromhex(descriptor["handle"])
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
    return KvIpcHandle(handle=list(handle), bytes=int(descriptor["bytes"]),
                       header_offset=int(descriptor["header_offset"]), generation=int(descriptor["generation"]),
                       buffer=int(descriptor["buffer"]), rows=int(descriptor["rows"]),
                       shape=[int(n) for n in descriptor["shape"]], element=str(descriptor["element"]),
                       finite=bool(descriptor["finite"]), device_pci_bus_id=str(descriptor["device_pci_bus_id"]),
                       generation_board=str(descriptor.get("generation_board") or ""))


def kv_descriptor(msg: KvIpcHandle) -> dict:
    """The dict model/cuda_ipc.py maps; SwapProtocolError for a layout no arena has."""
    shape = [int(n) for n in msg.shape]
    if shape[0] != 2 or min(shape) < 1 or msg.rows > shape[2] or msg.header_offset >= msg.bytes:
        raise SwapProtocolError(f"KvIpcHandle describes no KV export: shape {shape}, {msg.rows} rows, header at "
                                f"{msg.header_offset} of {msg.bytes} bytes")
    descriptor = {"handle": bytes(msg.handle).hex(), "bytes": int(msg.bytes), "header_offset": int(msg.header_offset),
                  "generation": int(msg.generation), "buffer": int(msg.buffer), "rows": int(msg.rows), "shape": shape,
                  "element": msg.element, "finite": bool(msg.finite), "device_pci_bus_id": msg.device_pci_bus_id}
    if msg.generation_board:              # empty: no board, the device word is read (never a path "")
        descriptor["generation_board"] = msg.generation_board
    return descriptor
