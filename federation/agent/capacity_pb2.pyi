from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("client", "owner")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    client: str
    owner: str
    def __init__(self, client: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class Taint(_message.Message):
    __slots__ = ("key", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class NumaZone(_message.Message):
    __slots__ = ("name", "available")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    available: _containers.RepeatedCompositeFieldContainer[Resource]
    def __init__(self, name: _Optional[str] = ..., available: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "ready", "schedulable", "taints", "allocatable", "online_used", "ours_used", "gpu_product", "network_pod", "zone", "numa")
    NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    ONLINE_USED_FIELD_NUMBER: _ClassVar[int]
    OURS_USED_FIELD_NUMBER: _ClassVar[int]
    GPU_PRODUCT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POD_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    NUMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    ready: bool
    schedulable: bool
    taints: _containers.RepeatedCompositeFieldContainer[Taint]
    allocatable: _containers.RepeatedCompositeFieldContainer[Resource]
    online_used: _containers.RepeatedCompositeFieldContainer[Resource]
    ours_used: _containers.RepeatedCompositeFieldContainer[Resource]
    gpu_product: str
    network_pod: str
    zone: str
    numa: _containers.RepeatedCompositeFieldContainer[NumaZone]
    def __init__(self, name: _Optional[str] = ..., ready: _Optional[bool] = ..., schedulable: _Optional[bool] = ..., taints: _Optional[_Iterable[_Union[Taint, _Mapping]]] = ..., allocatable: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., online_used: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., ours_used: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., gpu_product: _Optional[str] = ..., network_pod: _Optional[str] = ..., zone: _Optional[str] = ..., numa: _Optional[_Iterable[_Union[NumaZone, _Mapping]]] = ...) -> None: ...

class Update(_message.Message):
    __slots__ = ("version", "snapshot", "nodes", "removed", "heartbeat", "member", "sent_unix_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    snapshot: bool
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    removed: _containers.RepeatedScalarFieldContainer[str]
    heartbeat: bool
    member: str
    sent_unix_ms: int
    def __init__(self, version: _Optional[int] = ..., snapshot: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ..., heartbeat: _Optional[bool] = ..., member: _Optional[str] = ..., sent_unix_ms: _Optional[int] = ...) -> None: ...
