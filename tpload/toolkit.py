"""The tools' internal API: every name of the core that ``tpload/tools/`` and ``launch/`` use.

A tool imports from here, from ``tpload`` itself (``load``, the errors, ``LoadOptions``), from the
data floor (``tpload.model.*``) and from other tools, never from another core module
(import-linter's ``tools-through-toolkit`` contract; tests/unit/tools/test_toolkit.py for launch/).
When the core moves a module, this table changes, not the tools; and no tool reaches into the load's
loop or the planner's internals except through a name listed here.

Each name is imported on first use (PEP 562) from the module :data:`FACE` gives, so a tool pays for
what it takes only: ``tpload plan`` never imports the compiled kernels, nor the bench's harness
before a method's timed imports. docs/development.md lists them ("The tools' internal API").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

FACE: dict[str, tuple[str, str]] = {
    # name: (where it lives under tpload, ``module`` or ``module:its name there``; what it is)
    # -- a checkpoint opened: its files, its tensor table, its bytes
    "ShardedStorage": ("storage.sharded", "a native folder's shards opened: catalogue, reads"),
    "PartitionedStorage": ("storage.partitioned", "one rank's view of an export's rank files"),
    "is_partitioned": ("storage.partitioned", "whether a folder is an export (rank files)"),
    "rank_file": ("storage.partitioned", "the name of an export's file for one rank"),
    "open_storage": ("storage.open", "the storage a rank loads from (native or export)"),
    "read_native": ("storage.catalogue", "a folder's catalogue, read from its headers and index"),
    "Catalogue": ("storage.catalogue", "every tensor of a checkpoint, and its manifest"),
    "TensorInfo": ("storage.safetensors", "a stored tensor as its header names it, and its file"),
    "Storage": ("storage.base", "what a load needs from a checkpoint on disk (the Protocol)"),
    "Reader": ("storage.reader", "reads windows of a storage through the ring of buffers"),
    "READER_CHUNK_BYTES": ("storage.reader:CHUNK_BYTES", "bytes of one staging buffer"),
    "READER_RING": ("storage.reader:RING", "how many staging buffers a reader rings through"),
    "HEADERS_ONLY_KEY": ("storage.catalogue:HEADERS_ONLY", "a headers-only checkpoint's mark"),
    "GGUF_HEADERS_ONLY_KEY": ("storage.gguf:HEADERS_ONLY_KEY", "the same mark in a GGUF file"),
    "GGUF_TYPES": ("storage.gguf:TYPES", "GGUF's tensor type ids: (name, block, bytes, dtype)"),
    # -- files: read bounded, written whole
    "read_json": ("storage.files", "a small JSON file read whole through the bounded reader"),
    "open_regular": ("storage.files", "a read-only descriptor of a regular file, else refused"),
    "atomic_write": ("storage.files", "write a file beside and rename it into place"),
    "atomic_file": ("storage.files", "atomic_write's open file, for data written in pieces"),
    "folder_of": ("storage.files", "the checkpoint folder a path names (a .gguf's folder)"),
    "not_a_folder": ("options.rules", "why a path cannot be (or be made) a folder"),
    "resident_bytes": ("storage.pagecache", "bytes of a file in the page cache"),
    # -- checkpoints written
    "write_safetensors": ("storage.safetensors", "a safetensors file written chunk by chunk"),
    "ITEMSIZE": ("model.meta", "bytes per element of each safetensors dtype"),
    "pins_doc": ("storage.pins", "the JSON files' pins a manifest tpload writes holds"),
    "pins_to_write": ("storage.pins", "an export manifest's pins of its folder's JSON files"),
    "Pins": ("storage.pins", "what a manifest on disk pins of its folder's JSON files"),
    "to_hub_cache": ("storage.hub", "move a folder into a hub cache's layout"),
    "upload_digest": ("storage.hub", "the digest the hub names an uploaded file by"),
    "git_blob_sha1": ("storage.hub", "git's object name of a blob"),
    "lfs_sha256": ("storage.hub", "the sha256 an LFS object is named by"),
    # -- a config chosen, a layout planned
    "choose": ("loading.pick", "the config a spec names for a checkpoint (auto: detected)"),
    "model_for": ("loading.pick", "the checkpoint's config.json for the planner"),
    "with_rules": ("selection.config", "a config with skip and defer rules put first"),
    "Config": ("selection.config", "a parsed config: rules in order, layout constants"),
    "load_config": ("selection.config", "a config by name or path, parsed and checked"),
    "DEFAULT_CONFIG": ("selection.defaults", "the config a command picks unless told (auto)"),
    "planner_of": ("loading.planner", "a planner of a catalogue, given its config.json"),
    "Planner": ("planning.planner", "a catalogue classified once, cut for any layout"),
    "RankPlan": ("planning.planner", "everything one rank will do, before any byte is read"),
    "Layout": ("model.values", "how a group's ranks split a checkpoint: tp x ep"),
    "Item": ("planning.items", "one unit of a plan: a weight and its scales, served"),
    "Output": ("planning.items", "one served tensor: a slot of the rank's arena"),
    "Cut": ("codecs.base", "the box of one stored tensor a rank reads"),
    "assign_hashing": ("verification.node", "whole tensors split between ranks to hash"),
    "readers": ("verification.node", "each whole-read tensor's ranks that read a window of it"),
    # -- stored formats decoded
    "decode_rows": ("loading.loop", "a codec's decode on a cut's rows, as the load runs it"),
    "value_feed": ("loading.loop", "the value check a cut's blocks go to, as the load feeds"),
    "FP4_GROUP": ("codecs.fp4_e8m0:GROUP", "FP4 elements sharing one E8M0 scale"),
    "NVFP4_GROUP": ("codecs.nvfp4:GROUP", "NVFP4 elements sharing one E4M3 scale"),
    "GGUF_BLOCKS": ("codecs.gguf:BLOCKS", "each GGUF quant type's (weights, bytes) per block"),
    "GGUF_SCALE_OFFSETS": ("codecs.gguf:SCALE_OFFSETS", "where a GGUF block keeps its f16s"),
    "gguf_decode_torch": ("codecs.gguf:decode_torch", "GGUF blocks to bf16 by torch ops"),
    "gguf_decode_kernel": ("kernels.gguf:decode", "GGUF blocks to bf16 bits, compiled"),
    # -- checked: hashes, the gate, signatures, digests
    "gate_at_rest": ("sources.hashing:at_rest", "the gate's verdict on tensors read whole at rest"),
    "Vouched": ("verification.vouched", "tensors the gate checked at rest, with their hashes"),
    "hash_whole": ("sources.hashing", "hashes of named tensors, each read whole once"),
    "mismatches": ("verification.hashes", "each hashed tensor whose hash is not the promised"),
    "FileHasher": ("sources.whole_files", "files hashed whole on a background thread"),
    "file_problems": ("verification.hashes", "each hashed file whose digest is not its source's"),
    "SignedModel": ("verification.signing", "what a verified model.sig vouches for"),
    "DigestStore": ("verification.store", "the operator's store of trusted digests"),
    "checkpoint_stamp": ("verification.store", "what a stored prediction vouches for"),
    "stale": ("verification.store", "what changed since a stamp was taken"),
    "layout_key": ("verification.strategy", "the digest store's key of a config and layout"),
    "Digests": ("verification.hashes", "which content hash proves a tensor's bytes"),
    "write_sidecar": ("verification.store", "keep the blake3 of tensors the gate checked"),
    "require_blake3": ("verification.hashes:require", "a clear error without blake3"),
    "blake3_available": ("verification.hashes:available", "whether blake3 imports"),
    "BLAKE3_INSTALL": ("verification.hashes:INSTALL", "how to install blake3"),
    "predict": ("attest.predict", "every rank's digest, computed by the load's own code"),
    "spare_cores": ("sources.hashing", "cores a process may use beyond its main thread"),
    "digest": ("verification.digest", "a rank's digest of its served tensors"),
    "fingerprint": ("kernels.fingerprint", "a served tensor's fingerprint where it lives"),
    "as_bytes2d": ("kernels.fingerprint", "a served tensor as the 2-D bytes fingerprinted"),
    # -- measured: memory, transfer, the world
    "new_arena": ("transfer.cpu", "the rank's arena on the CPU (tpload's allocator)"),
    "CUDA_CHUNK_BYTES": ("transfer.base", "bytes of one pinned buffer of the CUDA transfer"),
    "MemoryPeaks": ("report.memory", "this process's RSS and anonymous memory peaks"),
    "init_world": ("distributed.world", "the process group tpload.load() would make"),
    "Parser": ("options.flags", "a subcommand's parser: a bad flag ends in one line"),
}
"""Every name of the face: where it lives, and what it is (one line)."""

__all__ = sorted(FACE)


def __getattr__(name: str) -> object:
    entry = FACE.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = entry[0].partition(":")
    return getattr(importlib.import_module(f"tpload.{module}"), attr or name)


def __dir__() -> list[str]:
    return sorted([*globals(), *FACE])


if TYPE_CHECKING:  # the face for the type checker and import-linter (the same names as FACE)
    from .attest.predict import predict as predict
    from .codecs.base import Cut as Cut
    from .codecs.fp4_e8m0 import GROUP as FP4_GROUP  # noqa: F401  re-exported
    from .codecs.gguf import BLOCKS as GGUF_BLOCKS  # noqa: F401  re-exported
    from .codecs.gguf import SCALE_OFFSETS as GGUF_SCALE_OFFSETS  # noqa: F401  re-exported
    from .codecs.gguf import decode_torch as gguf_decode_torch  # noqa: F401  re-exported
    from .codecs.nvfp4 import GROUP as NVFP4_GROUP  # noqa: F401  re-exported
    from .distributed.world import init_world as init_world
    from .kernels.fingerprint import as_bytes2d as as_bytes2d
    from .kernels.fingerprint import fingerprint as fingerprint
    from .kernels.gguf import decode as gguf_decode_kernel  # noqa: F401  re-exported
    from .loading.loop import decode_rows as decode_rows
    from .loading.loop import value_feed as value_feed
    from .loading.pick import choose as choose
    from .loading.pick import model_for as model_for
    from .loading.planner import planner_of as planner_of
    from .model.meta import ITEMSIZE as ITEMSIZE
    from .model.values import Layout as Layout
    from .options.flags import Parser as Parser
    from .options.rules import not_a_folder as not_a_folder
    from .planning.items import Item as Item
    from .planning.items import Output as Output
    from .planning.planner import Planner as Planner
    from .planning.planner import RankPlan as RankPlan
    from .report.memory import MemoryPeaks as MemoryPeaks
    from .selection.config import Config as Config
    from .selection.config import load_config as load_config
    from .selection.config import with_rules as with_rules
    from .selection.defaults import DEFAULT_CONFIG as DEFAULT_CONFIG
    from .sources.hashing import at_rest as gate_at_rest  # noqa: F401  re-exported
    from .sources.hashing import hash_whole as hash_whole
    from .sources.hashing import spare_cores as spare_cores
    from .sources.whole_files import FileHasher as FileHasher
    from .storage.base import Storage as Storage
    from .storage.catalogue import HEADERS_ONLY as HEADERS_ONLY_KEY  # noqa: F401  re-exported
    from .storage.catalogue import Catalogue as Catalogue
    from .storage.catalogue import read_native as read_native
    from .storage.files import atomic_file as atomic_file
    from .storage.files import atomic_write as atomic_write
    from .storage.files import folder_of as folder_of
    from .storage.files import open_regular as open_regular
    from .storage.files import read_json as read_json
    from .storage.gguf import HEADERS_ONLY_KEY as GGUF_HEADERS_ONLY_KEY  # noqa: F401  re-exported
    from .storage.gguf import TYPES as GGUF_TYPES  # noqa: F401  re-exported
    from .storage.hub import git_blob_sha1 as git_blob_sha1
    from .storage.hub import lfs_sha256 as lfs_sha256
    from .storage.hub import to_hub_cache as to_hub_cache
    from .storage.hub import upload_digest as upload_digest
    from .storage.open import open_storage as open_storage
    from .storage.pagecache import resident_bytes as resident_bytes
    from .storage.partitioned import PartitionedStorage as PartitionedStorage
    from .storage.partitioned import is_partitioned as is_partitioned
    from .storage.partitioned import rank_file as rank_file
    from .storage.pins import Pins as Pins
    from .storage.pins import pins_doc as pins_doc
    from .storage.pins import pins_to_write as pins_to_write
    from .storage.reader import CHUNK_BYTES as READER_CHUNK_BYTES  # noqa: F401  re-exported
    from .storage.reader import RING as READER_RING  # noqa: F401  re-exported
    from .storage.reader import Reader as Reader
    from .storage.safetensors import TensorInfo as TensorInfo
    from .storage.safetensors import write_safetensors as write_safetensors
    from .storage.sharded import ShardedStorage as ShardedStorage
    from .transfer.base import CUDA_CHUNK_BYTES as CUDA_CHUNK_BYTES
    from .transfer.cpu import new_arena as new_arena
    from .verification.digest import digest as digest
    from .verification.hashes import INSTALL as BLAKE3_INSTALL  # noqa: F401  re-exported
    from .verification.hashes import Digests as Digests
    from .verification.hashes import available as blake3_available  # noqa: F401  re-exported
    from .verification.hashes import file_problems as file_problems
    from .verification.hashes import mismatches as mismatches
    from .verification.hashes import require as require_blake3  # noqa: F401  re-exported
    from .verification.node import assign_hashing as assign_hashing
    from .verification.node import readers as readers
    from .verification.signing import SignedModel as SignedModel
    from .verification.store import DigestStore as DigestStore
    from .verification.store import checkpoint_stamp as checkpoint_stamp
    from .verification.store import stale as stale
    from .verification.store import write_sidecar as write_sidecar
    from .verification.strategy import layout_key as layout_key
    from .verification.vouched import Vouched as Vouched


if TYPE_CHECKING:
    # the names re-exported under another name (the type checker reads a literal list only)
    __all__ += [
        "FP4_GROUP",
        "GGUF_BLOCKS",
        "GGUF_SCALE_OFFSETS",
        "gguf_decode_torch",
        "NVFP4_GROUP",
        "gguf_decode_kernel",
        "gate_at_rest",
        "HEADERS_ONLY_KEY",
        "GGUF_HEADERS_ONLY_KEY",
        "GGUF_TYPES",
        "READER_CHUNK_BYTES",
        "READER_RING",
        "BLAKE3_INSTALL",
        "blake3_available",
        "require_blake3",
    ]
