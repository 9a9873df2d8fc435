"""A fake torch for the CPU tests of adapters/torch_runtime.py: the names its patch table wraps,
whose "C++" half fires the GPU-trace callbacks the way c10 does. A package of its own so that a
recorder can count its frames as the library's (FAKE_TORCH_DIR), as it counts torch's."""
from __future__ import annotations

import os
import sys
import types

from streamcheck.record.adapters import torch_runtime as TR

FAKE_TORCH_DIR = os.path.dirname(os.path.abspath(__file__))


class FakeTorch:
    """The torch names torch_runtime patches, whose C++ half fires the GPU-trace callbacks the way
    c10 does (after the call, and only for an event that was recorded); `made`: the calls made."""

    def __init__(self, monkeypatch):
        made = self.made = []
        self.module = torch = types.ModuleType("torch")
        torch.cuda = types.ModuleType("torch.cuda")
        torch.cuda.streams = types.ModuleType("torch.cuda.streams")
        torch.accelerator = types.ModuleType("torch.accelerator")
        torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: self.current)
        torch.cuda.current_device = lambda: 0
        self.current = 0x10

        def synchronize(device=None):
            made.append("device synchronize")
            TR._device_synchronized()

        class Stream:
            def synchronize(self):
                made.append(f"synchronize {self.cuda_stream:#x}")
                TR._stream_synchronized(self.cuda_stream)

        class Event:
            cuda_event = 0  # torch creates the CUDA event at its first record

            def record(self, stream):
                self.cuda_event = 0xF1
                TR._event_recorded(self.cuda_event, stream.cuda_stream)

            def wait(self, stream=None):
                if self.cuda_event:
                    ptr = stream.cuda_stream if stream is not None else torch._C._cuda_getCurrentRawStream(0)
                    made.append(f"wait {ptr:#x}")
                    TR._event_waited(self.cuda_event, ptr)

            def synchronize(self):
                if self.cuda_event:
                    made.append("event synchronize")
                    TR._event_synchronized(self.cuda_event)

        torch.cuda.synchronize = torch.accelerator.synchronize = synchronize
        torch.cuda.streams.Stream, torch.cuda.streams.Event = Stream, Event
        modules = {"torch": torch, "torch.cuda": torch.cuda, "torch.cuda.streams": torch.cuda.streams,
                   "torch.accelerator": torch.accelerator}
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)

    def stream(self, ptr):
        stream = self.module.cuda.streams.Stream()
        stream.cuda_stream = stream.ptr = ptr  # torch's name, and the fake GPU's
        return stream
