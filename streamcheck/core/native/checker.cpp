// The happens-before checker's hot core in C++: hb.Checker's vector clocks and per-buffer byte-range
// shadow records, rule for rule and check for check, so that it finds the same race occurrences in the
// same order. streamcheck/core/fast.py wraps it (NativeChecker) and is the only caller; hb.py stays the
// reference: every report is built by replaying the operations into it (fast.py says when).
//
// What it models: host threads and their hand-offs, streams of every kind on any device (each device's
// legacy default stream and its joins), events, waits, host synchronizations and queries, allocations
// with reuse, strict and pending frees with record_stream, launches, copies and host accesses. Anything
// else (stream capture, graph launches, peer access, a kernel touching another device's memory, every
// condition on which hb.py raises TraceError, any field of an unexpected type) is answered SWITCH: the
// wrapper replays every operation fed so far into hb.Checker and hands it everything from then on.
//
// Clock components ("owners") are numbered in creation order, threads and streams alike, as in hb.py;
// a clock is a dense vector indexed by owner (a missing component is 0). A record keeps the index of its
// operation in the fed list, so a race occurrence is three indices and a kind.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::vector<uint64_t>;

inline uint64_t clock_get(const Clock& clock, uint32_t owner) {
    return owner < clock.size() ? clock[owner] : 0;
}

// clock := max(clock, other), componentwise.
inline void clock_join(Clock& clock, const Clock& other) {
    if (&clock == &other) return;
    if (clock.size() < other.size()) clock.resize(other.size(), 0);
    const size_t n = other.size();
    uint64_t* c = clock.data();
    const uint64_t* o = other.data();
    for (size_t i = 0; i < n; ++i) {
        if (c[i] < o[i]) c[i] = o[i];
    }
}

inline void clock_set(Clock& clock, uint32_t owner, uint64_t tick) {
    if (clock.size() <= owner) clock.resize(owner + 1, 0);
    clock[owner] = tick;
}

// Trace ids (threads, streams, events, buffers, channels, devices) -> slots: small non-negative ids
// (what every recorder hands out) index a vector, any other id goes through a hash map.
class IdMap {
public:
    static constexpr int64_t kDenseLimit = int64_t(1) << 22;

    int32_t get(int64_t id) const {
        if (id >= 0 && id < kDenseLimit) {
            return id < int64_t(dense_.size()) ? dense_[size_t(id)] : -1;
        }
        auto found = sparse_.find(id);
        return found == sparse_.end() ? -1 : found->second;
    }

    void set(int64_t id, int32_t slot) {
        if (id >= 0 && id < kDenseLimit) {
            if (id >= int64_t(dense_.size())) {
                size_t grown = std::max<size_t>(size_t(id) + 1, dense_.size() * 2);
                dense_.resize(std::min<size_t>(grown, size_t(kDenseLimit)), -1);
            }
            dense_[size_t(id)] = slot;
        } else {
            sparse_[id] = slot;
        }
    }

private:
    std::vector<int32_t> dense_;
    std::unordered_map<int64_t, int32_t> sparse_;
};

enum Kind : uint8_t { RAW = 0, WAR = 1, WAW = 2, FREE = 3 };
const char* const kKindNames[] = {"RAW", "WAR", "WAW", "FREE"};

// A new reference to the kind's name (interned once per process).
PyObject* kind_name(Kind kind) {
    static PyObject* names[4] = {nullptr, nullptr, nullptr, nullptr};
    if (names[kind] == nullptr) names[kind] = PyUnicode_InternFromString(kKindNames[kind]);
    Py_XINCREF(names[kind]);
    return names[kind];
}

// One access as a buffer keeps it (hb.py's access tuple, less what only reports read).
struct Record {
    int64_t start, stop;
    uint64_t tick;
    uint64_t op;  // index of its operation in the fed list
    uint32_t owner;
    bool write;
};

struct Occurrence {
    uint64_t first;       // the earlier access's operation
    uint64_t second;      // the later one's, as on_race names it (a reuse's race: the allocation)
    uint64_t key_second;  // the operation whose site is in Race.key (a reuse's race: the free)
    Kind kind;
    uint32_t first_owner, second_owner;  // the two actors (hb.py's _Seen.pairs)
    uint64_t alloc;  // the operation that allocated the buffer (its name is the report's buffer)
};

struct Thread {
    uint32_t owner;
    Clock clock;
    uint64_t version = 0;  // bumped whenever the clock changes, so streams skip redundant joins
};

struct Device {
    int64_t index;
    int32_t legacy = -1;  // its legacy default stream's slot
    uint64_t legacy_version = 0;
    std::vector<int32_t> joiners;  // its blocking and per-thread default streams
    std::vector<int32_t> streams;
};

struct Stream {
    uint32_t owner;
    int32_t device;  // slot
    bool is_legacy, joins_legacy;
    Clock clock;
    std::vector<uint64_t> host_seen;  // thread slot -> version of its clock already joined
    int64_t legacy_seen = -1;
};

struct Event {
    bool recorded = false;  // hb.py: state is not None
    bool destroyed = false;
    int32_t stream = -1;
    Clock state;
};

struct Buffer {
    uint64_t alloc = 0;  // the operation that allocated it
    int64_t nbytes = 0;
    int64_t device = 0;
    bool freed = false;
    std::vector<Record> records;  // not yet subsumed by a later access
};

// A free (not strict) with uses pending for a later allocation of its bytes (hb.py's _Freed).
struct Freed {
    uint64_t op;
    uint32_t owner;
    uint64_t alloc;  // the freed buffer's allocation (hb.py's _Freed.buffer)
    bool reused = false;
    std::vector<Record> pending, unordered;
};

struct Span {  // a Range of an operation, checked
    int32_t buffer;
    int64_t start, stop;
};

// The operation records of streamcheck.core.trace, in the order configure() receives them.
enum OpType {
    T_THREAD_START, T_THREAD_JOIN, T_HAND_OFF, T_TAKE_OVER, T_STREAM_CREATE, T_EVENT_CREATE, T_EVENT_DESTROY,
    T_EVENT_RECORD, T_STREAM_WAIT, T_STREAM_SYNC, T_EVENT_SYNC, T_STREAM_QUERY, T_EVENT_QUERY, T_DEVICE_SYNC,
    T_ALLOC, T_FREE, T_LAUNCH, T_COPY, T_HOST_ACCESS, T_IMPLICIT_SYNC, N_OP_TYPES
};
enum StreamKindIndex { K_LEGACY, K_PER_THREAD, K_BLOCKING, K_NON_BLOCKING, N_KINDS };

PyObject* g_types[N_OP_TYPES];  // the classes, compared by identity with an operation's type
PyObject* g_kinds[N_KINDS];
PyObject* g_parse_kind;  // StreamKind.parse

PyObject *s_thread, *s_parent, *s_child, *s_channel, *s_stream, *s_kind, *s_device, *s_event, *s_done,
    *s_buffer, *s_nbytes, *s_reuses, *s_also, *s_strict, *s_reads, *s_writes, *s_src, *s_dst, *s_start, *s_stop,
    *s_switch;

enum Status { OK, SWITCH };

// --- reading an operation's fields -------------------------------------------------------------
// Anything but an exact int that fits 64 bits (or a missing attribute) is SWITCH: hb.py then decides.

bool read_int(PyObject* value, int64_t* out) {
    if (!PyLong_CheckExact(value)) return false;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) return false;
    *out = v;
    return true;
}

bool attr_int(PyObject* op, PyObject* name, int64_t* out) {
    PyObject* value = PyObject_GetAttr(op, name);
    if (value == nullptr) {
        PyErr_Clear();
        return false;
    }
    bool ok = read_int(value, out);
    Py_DECREF(value);
    return ok;
}

// An optional int field: *present is false for None.
bool attr_opt_int(PyObject* op, PyObject* name, bool* present, int64_t* out) {
    PyObject* value = PyObject_GetAttr(op, name);
    if (value == nullptr) {
        PyErr_Clear();
        return false;
    }
    bool ok = true;
    if (value == Py_None) {
        *present = false;
    } else {
        *present = true;
        ok = read_int(value, out);
    }
    Py_DECREF(value);
    return ok;
}

bool attr_truth(PyObject* op, PyObject* name, bool* out) {
    PyObject* value = PyObject_GetAttr(op, name);
    if (value == nullptr) {
        PyErr_Clear();
        return false;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth < 0) {
        PyErr_Clear();
        return false;
    }
    *out = truth != 0;
    return true;
}

// A tuple field, as a new reference (nullptr: not a tuple).
PyObject* attr_tuple(PyObject* op, PyObject* name) {
    PyObject* value = PyObject_GetAttr(op, name);
    if (value == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    if (!PyTuple_CheckExact(value)) {
        Py_DECREF(value);
        return nullptr;
    }
    return value;
}

bool range_fields(PyObject* rng, int64_t* buffer, int64_t* start, int64_t* stop) {
    return attr_int(rng, s_buffer, buffer) && attr_int(rng, s_start, start) && attr_int(rng, s_stop, stop);
}

// The OpType of an operation record (its class, by identity), or -1.
int op_type(PyObject* op) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(op));
    for (int i = 0; i < N_OP_TYPES; ++i) {
        if (g_types[i] == type) return i;
    }
    return -1;
}

class Core {
public:
    std::vector<Occurrence> occurrences;

    Core() {
        devices_.push_back(Device{0});
        device_ids_.set(0, 0);
        new_thread(0);
    }

    // Check one operation (index `index` of the fed list). SWITCH: hb.py must take over from here.
    Status feed(PyObject* op, uint64_t index) {
        index_ = index;
        int kind = op_type(op);
        if (kind < 0) return SWITCH;  // capture, graphs, peer access, or not an operation at all
        int64_t thread_id;
        if (!attr_int(op, s_thread, &thread_id)) return SWITCH;
        int32_t thread = threads_ids_.get(thread_id);
        if (kind == T_THREAD_START) return thread_start(op, thread_id, thread);
        if (thread < 0) return SWITCH;  // unknown host thread
        switch (kind) {
            case T_THREAD_JOIN: return thread_join(op, thread);
            case T_HAND_OFF: return hand_off(op, thread);
            case T_TAKE_OVER: return take_over(op, thread);
            case T_STREAM_CREATE: return stream_create(op);
            case T_EVENT_CREATE: return event_create(op);
            case T_EVENT_DESTROY: return event_destroy(op);
            case T_EVENT_RECORD: return event_record(op, thread);
            case T_STREAM_WAIT: return stream_wait(op, thread);
            case T_STREAM_SYNC: return stream_sync(op, thread);
            case T_EVENT_SYNC: return event_sync(op, thread, false);
            case T_STREAM_QUERY: return stream_query(op, thread);
            case T_EVENT_QUERY: return event_sync(op, thread, true);
            case T_DEVICE_SYNC: return device_sync(op, thread);
            case T_ALLOC: return alloc(op, thread);
            case T_FREE: return free_(op, thread);
            case T_LAUNCH: return launch(op, thread, true);
            case T_COPY: return launch(op, thread, false);
            case T_HOST_ACCESS: return host_access(op, thread);
            case T_IMPLICIT_SYNC: return OK;  // deliberately not an edge: CUDA promises nothing
        }
        return SWITCH;
    }

    // hb.py's Checker.sync_clocks for synchronization `op`, not fed yet: false where it returns None. `needed`: the
    // clock it joins; `have`: the clock of what it orders; `ordered`: that actor's owner; `source`: the owner
    // whose work it waits for (-1 for a device synchronize).
    bool sync_clocks(PyObject* op, Clock& needed, Clock& have, uint32_t& ordered, int64_t& source) {
        int kind = op_type(op);
        int64_t thread_id;
        if (kind < 0 || !attr_int(op, s_thread, &thread_id)) return false;
        int32_t slot = threads_ids_.get(thread_id);
        if (slot < 0) return false;
        const Thread& thread = threads_[size_t(slot)];
        int64_t id;
        switch (kind) {
            case T_STREAM_WAIT: {
                int32_t event = attr_int(op, s_event, &id) ? event_ids_.get(id) : -1;
                int32_t stream = stream_of(op);
                if (event < 0 || stream < 0 || !events_[size_t(event)].recorded) return false;
                const Event& ev = events_[size_t(event)];
                needed = ev.state;
                have = streams_[size_t(stream)].clock;
                clock_join(have, thread.clock);  // what the host issued before the wait is ordered anyway
                ordered = streams_[size_t(stream)].owner;
                source = streams_[size_t(ev.stream)].owner;
                return true;
            }
            case T_STREAM_SYNC:
            case T_STREAM_QUERY: {
                int32_t stream = stream_of(op);
                if (stream < 0) return false;
                needed = streams_[size_t(stream)].clock;
                source = streams_[size_t(stream)].owner;
                break;
            }
            case T_EVENT_SYNC:
            case T_EVENT_QUERY: {
                int32_t event = attr_int(op, s_event, &id) ? event_ids_.get(id) : -1;
                if (event < 0 || !events_[size_t(event)].recorded) return false;
                needed = events_[size_t(event)].state;
                source = streams_[size_t(events_[size_t(event)].stream)].owner;
                break;
            }
            case T_DEVICE_SYNC: {
                if (!attr_int(op, s_device, &id)) return false;
                int32_t dev = device_ids_.get(id);  // a device never used: no stream to wait for
                needed.clear();
                if (dev >= 0) {
                    for (int32_t stream : devices_[size_t(dev)].streams) clock_join(needed, streams_[size_t(stream)].clock);
                }
                source = -1;
                break;
            }
            default:
                return false;
        }
        have = thread.clock;
        ordered = thread.owner;
        return true;
    }

    // hb.py's Checker.thread_owner: -1 for a thread not started.
    int64_t thread_owner(int64_t thread_id) {
        int32_t slot = threads_ids_.get(thread_id);
        return slot >= 0 ? int64_t(threads_[size_t(slot)].owner) : -1;
    }

    // Frees with a use pending on another stream whose bytes no allocation got: hb.py's hazards.
    bool has_hazards() const {
        for (const auto& entry : freed_) {
            if (!entry.second.reused && !entry.second.unordered.empty()) return true;
        }
        return false;
    }

private:
    std::vector<Thread> threads_;
    IdMap threads_ids_;
    std::vector<Stream> streams_;
    IdMap stream_ids_;
    std::vector<Event> events_;
    IdMap event_ids_;
    std::vector<Buffer> buffers_;
    IdMap buffer_ids_;
    std::vector<Clock> channels_;
    IdMap channel_ids_;
    std::vector<Device> devices_;
    IdMap device_ids_;
    std::unordered_map<int64_t, Freed> freed_;  // freed buffer id -> the uses pending at its free
    uint32_t owners_ = 0;
    bool multi_ = false;  // a second device is in use: kernels check peer access
    uint64_t index_ = 0;
    std::vector<Span> spans_;  // scratch for an operation's ranges
    Clock scratch_;

    // --- clocks ------------------------------------------------------------------------------
    int32_t new_thread(int64_t id) {
        Thread thread;
        thread.owner = owners_++;
        clock_set(thread.clock, thread.owner, 1);
        threads_.push_back(std::move(thread));
        int32_t slot = int32_t(threads_.size() - 1);
        threads_ids_.set(id, slot);
        return slot;
    }

    // Order the next operation on the stream after what the host and CUDA's implicit legacy-stream
    // rules require; its tick.
    uint64_t issue(int32_t thread_slot, int32_t stream_slot) {
        Thread& thread = threads_[size_t(thread_slot)];
        Stream& stream = streams_[size_t(stream_slot)];
        if (stream.host_seen.size() <= size_t(thread_slot)) stream.host_seen.resize(size_t(thread_slot) + 1, UINT64_MAX);
        if (stream.host_seen[size_t(thread_slot)] != thread.version) {
            clock_join(stream.clock, thread.clock);
            stream.host_seen[size_t(thread_slot)] = thread.version;
        }
        Device& dev = devices_[size_t(stream.device)];
        if (stream.is_legacy) {
            // The legacy stream waits for all earlier work on its device's blocking streams.
            for (int32_t other : dev.joiners) clock_join(stream.clock, streams_[size_t(other)].clock);
            dev.legacy_version += 1;
        } else if (stream.joins_legacy) {
            // ... and later work on blocking streams waits for their device's legacy stream.
            if (dev.legacy >= 0 && stream.legacy_seen != int64_t(dev.legacy_version)) {
                clock_join(stream.clock, streams_[size_t(dev.legacy)].clock);
                stream.legacy_seen = int64_t(dev.legacy_version);
            }
        }
        uint64_t tick = clock_get(stream.clock, stream.owner) + 1;
        clock_set(stream.clock, stream.owner, tick);
        return tick;
    }

    uint64_t host_tick(int32_t slot) {
        Thread& thread = threads_[size_t(slot)];
        uint64_t tick = clock_get(thread.clock, thread.owner) + 1;
        clock_set(thread.clock, thread.owner, tick);
        thread.version += 1;
        return tick;
    }

    void host_join(int32_t slot, const Clock& other) {
        Thread& thread = threads_[size_t(slot)];
        clock_join(thread.clock, other);
        thread.version += 1;
    }

    // --- lookups: -1 where hb.py raises TraceError --------------------------------------------
    int32_t stream_of(PyObject* op) {
        int64_t id;
        return attr_int(op, s_stream, &id) ? stream_ids_.get(id) : -1;
    }

    int32_t event_of(PyObject* op) {  // unknown or destroyed: -1
        int64_t id;
        if (!attr_int(op, s_event, &id)) return -1;
        int32_t slot = event_ids_.get(id);
        return slot >= 0 && !events_[size_t(slot)].destroyed ? slot : -1;
    }

    // The device of index `index` (a new one on first use); -1 for what is not a device index.
    int32_t device(int64_t index) {
        int32_t slot = device_ids_.get(index);
        if (slot >= 0) return slot;
        if (index < 0) return -1;
        devices_.push_back(Device{index});
        slot = int32_t(devices_.size() - 1);
        device_ids_.set(index, slot);
        multi_ = true;
        return slot;
    }

    // The ranges of a tuple field, checked as hb.py's _check_ranges does (appended to spans_).
    bool ranges(PyObject* tuple) {
        Py_ssize_t n = PyTuple_GET_SIZE(tuple);
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (!range(PyTuple_GET_ITEM(tuple, i))) return false;
        }
        return true;
    }

    bool range(PyObject* rng) {
        int64_t buffer_id, start, stop;
        if (!range_fields(rng, &buffer_id, &start, &stop)) return false;
        int32_t slot = buffer_ids_.get(buffer_id);
        if (slot < 0) return false;
        const Buffer& buf = buffers_[size_t(slot)];
        if (buf.freed || !(0 <= start && start <= stop && stop <= buf.nbytes)) return false;
        spans_.push_back(Span{slot, start, stop});
        return true;
    }

    // --- handlers ----------------------------------------------------------------------------
    Status thread_start(PyObject* op, int64_t id, int32_t child) {
        bool has_parent;
        int64_t parent_id;
        if (!attr_opt_int(op, s_parent, &has_parent, &parent_id)) return SWITCH;
        int32_t parent = -1;
        if (has_parent) {
            parent = threads_ids_.get(parent_id);
            if (parent < 0) return SWITCH;
        }
        if (child < 0) {
            child = new_thread(id);
        } else if (id != 0) {  // thread 0 (the main thread) exists from the start
            return SWITCH;
        }
        if (parent >= 0) {
            host_join(child, threads_[size_t(parent)].clock);
            host_tick(parent);
        }
        return OK;
    }

    Status thread_join(PyObject* op, int32_t thread) {
        int64_t child_id;
        if (!attr_int(op, s_child, &child_id)) return SWITCH;
        int32_t child = threads_ids_.get(child_id);
        if (child < 0) return SWITCH;
        host_join(thread, threads_[size_t(child)].clock);
        return OK;
    }

    Status hand_off(PyObject* op, int32_t thread) {
        int64_t channel_id;
        if (!attr_int(op, s_channel, &channel_id)) return SWITCH;
        int32_t slot = channel_ids_.get(channel_id);
        if (slot < 0) {
            channels_.emplace_back();
            slot = int32_t(channels_.size() - 1);
            channel_ids_.set(channel_id, slot);
        }
        clock_join(channels_[size_t(slot)], threads_[size_t(thread)].clock);
        host_tick(thread);  // what the thread does next is not handed over
        return OK;
    }

    Status take_over(PyObject* op, int32_t thread) {
        int64_t channel_id;
        if (!attr_int(op, s_channel, &channel_id)) return SWITCH;
        int32_t slot = channel_ids_.get(channel_id);
        if (slot >= 0) host_join(thread, channels_[size_t(slot)]);  // a channel nobody handed off through: nothing
        return OK;
    }

    Status stream_create(PyObject* op) {
        int64_t id, device_index;
        if (!attr_int(op, s_stream, &id) || stream_ids_.get(id) >= 0) return SWITCH;
        PyObject* kind_value = PyObject_GetAttr(op, s_kind);
        if (kind_value == nullptr) {
            PyErr_Clear();
            return SWITCH;
        }
        int kind = -1;
        for (int i = 0; i < N_KINDS && kind < 0; ++i) {
            if (kind_value == g_kinds[i]) kind = i;
        }
        if (kind < 0) {  // a string: StreamKind.parse decides, as in hb.py
            PyObject* parsed = PyObject_CallOneArg(g_parse_kind, kind_value);
            if (parsed == nullptr) PyErr_Clear();
            for (int i = 0; i < N_KINDS && parsed != nullptr && kind < 0; ++i) {
                if (parsed == g_kinds[i]) kind = i;
            }
            Py_XDECREF(parsed);
        }
        Py_DECREF(kind_value);
        if (kind < 0) return SWITCH;
        if (!attr_int(op, s_device, &device_index)) return SWITCH;
        int32_t dev = device(device_index);
        if (dev < 0) return SWITCH;
        if (kind == K_LEGACY && devices_[size_t(dev)].legacy >= 0) return SWITCH;  // one legacy stream a device
        Stream stream;
        stream.owner = owners_++;
        stream.device = dev;
        stream.is_legacy = kind == K_LEGACY;
        stream.joins_legacy = kind == K_BLOCKING || kind == K_PER_THREAD;
        clock_set(stream.clock, stream.owner, 0);
        streams_.push_back(std::move(stream));
        int32_t slot = int32_t(streams_.size() - 1);
        stream_ids_.set(id, slot);
        Device& d = devices_[size_t(dev)];
        d.streams.push_back(slot);
        if (kind == K_LEGACY) {
            d.legacy = slot;
        } else if (kind == K_BLOCKING || kind == K_PER_THREAD) {
            d.joiners.push_back(slot);
        }
        return OK;
    }

    Status event_create(PyObject* op) {
        int64_t id;
        if (!attr_int(op, s_event, &id)) return SWITCH;
        int32_t slot = event_ids_.get(id);
        if (slot >= 0 && !events_[size_t(slot)].destroyed) return SWITCH;  // a destroyed id may be handed out again
        if (slot < 0) {
            events_.emplace_back();
            event_ids_.set(id, int32_t(events_.size() - 1));
        } else {
            events_[size_t(slot)] = Event();
        }
        return OK;
    }

    Status event_destroy(PyObject* op) {
        int32_t event = event_of(op);
        if (event < 0) return SWITCH;
        events_[size_t(event)].destroyed = true;
        return OK;
    }

    Status event_record(PyObject* op, int32_t thread) {
        int32_t event = event_of(op);
        if (event < 0) return SWITCH;
        int32_t stream = stream_of(op);
        if (stream < 0) return SWITCH;
        issue(thread, stream);
        Event& ev = events_[size_t(event)];
        ev.state = streams_[size_t(stream)].clock;  // replaces any earlier record
        ev.recorded = true;
        ev.stream = stream;
        return OK;
    }

    Status stream_wait(PyObject* op, int32_t thread) {
        int32_t event = event_of(op);
        if (event < 0) return SWITCH;
        int32_t stream = stream_of(op);
        if (stream < 0) return SWITCH;
        issue(thread, stream);
        const Event& ev = events_[size_t(event)];
        if (ev.recorded) clock_join(streams_[size_t(stream)].clock, ev.state);  // never recorded: a no-op
        return OK;
    }

    Status stream_sync(PyObject* op, int32_t thread) {
        int32_t stream = stream_of(op);
        if (stream < 0) return SWITCH;
        const Stream& s = streams_[size_t(stream)];
        if (s.is_legacy) {
            // Synchronizing the legacy stream also waits for its device's blocking streams (H200, cuda-rules.md).
            Thread& t = threads_[size_t(thread)];
            for (int32_t other : devices_[size_t(s.device)].joiners) clock_join(t.clock, streams_[size_t(other)].clock);
        }
        host_join(thread, s.clock);
        return OK;
    }

    Status event_sync(PyObject* op, int32_t thread, bool query) {
        int32_t event = event_of(op);
        if (event < 0) return SWITCH;
        if (query) {
            bool done;
            if (!attr_truth(op, s_done, &done)) return SWITCH;
            if (!done) return OK;  // a query that returned not-done orders nothing
        }
        const Event& ev = events_[size_t(event)];
        if (ev.recorded) host_join(thread, ev.state);
        return OK;
    }

    Status stream_query(PyObject* op, int32_t thread) {
        int32_t stream = stream_of(op);
        if (stream < 0) return SWITCH;
        bool done;
        if (!attr_truth(op, s_done, &done)) return SWITCH;
        if (done) host_join(thread, streams_[size_t(stream)].clock);
        return OK;
    }

    Status device_sync(PyObject* op, int32_t thread) {
        int64_t index;
        if (!attr_int(op, s_device, &index)) return SWITCH;
        int32_t dev = device(index);
        if (dev < 0) return SWITCH;
        Thread& t = threads_[size_t(thread)];
        for (int32_t stream : devices_[size_t(dev)].streams) {  // its own device's streams only
            clock_join(t.clock, streams_[size_t(stream)].clock);
        }
        t.version += 1;
        return OK;
    }

    Status alloc(PyObject* op, int32_t thread) {
        int64_t id, nbytes, device_index;
        if (!attr_int(op, s_buffer, &id)) return SWITCH;
        int32_t known = buffer_ids_.get(id);
        if (known >= 0 && !buffers_[size_t(known)].freed) return SWITCH;  // already allocated
        if (!attr_int(op, s_nbytes, &nbytes) || nbytes < 0) return SWITCH;
        if (!attr_int(op, s_device, &device_index) || device(device_index) < 0) return SWITCH;
        PyObject* reuses = attr_tuple(op, s_reuses);
        if (reuses == nullptr) return SWITCH;
        Status status = PyTuple_GET_SIZE(reuses) ? reuse(op, thread, reuses) : OK;
        Py_DECREF(reuses);
        if (status != OK) return status;
        // Before the new buffer replaces an old one of the same id (the reuse above read that one).
        if (known < 0) {
            buffers_.emplace_back();
            known = int32_t(buffers_.size() - 1);
            buffer_ids_.set(id, known);
        }
        Buffer& buf = buffers_[size_t(known)];
        buf.alloc = index_;
        buf.nbytes = nbytes;
        buf.device = device_index;
        buf.freed = false;
        buf.records.clear();
        return OK;
    }

    // An allocation handed freed bytes: each use pending at their free that is not ordered before the
    // allocation (its pool's stream, and the host that allocates) is a FREE race.
    Status reuse(PyObject* op, int32_t thread, PyObject* reuses) {
        struct Reused {
            int64_t buffer, start, stop;
        };
        std::vector<Reused> wanted;
        Py_ssize_t n = PyTuple_GET_SIZE(reuses);
        for (Py_ssize_t i = 0; i < n; ++i) {
            Reused r;
            if (!range_fields(PyTuple_GET_ITEM(reuses, i), &r.buffer, &r.start, &r.stop)) return SWITCH;
            int32_t old = buffer_ids_.get(r.buffer);
            if (old < 0 || !buffers_[size_t(old)].freed) return SWITCH;
            if (!(0 <= r.start && r.start <= r.stop && r.stop <= buffers_[size_t(old)].nbytes)) return SWITCH;
            wanted.push_back(r);
        }
        bool has_stream;
        int64_t stream_id;
        if (!attr_opt_int(op, s_stream, &has_stream, &stream_id)) return SWITCH;
        const Clock* clock = &threads_[size_t(thread)].clock;
        if (has_stream) {
            int32_t stream = stream_ids_.get(stream_id);
            if (stream < 0) return SWITCH;
            scratch_ = streams_[size_t(stream)].clock;
            clock_join(scratch_, *clock);
            clock = &scratch_;
        }
        for (const Reused& r : wanted) {
            auto found = freed_.find(r.buffer);
            if (found == freed_.end()) continue;  // nothing was pending at its free
            Freed& freed = found->second;
            freed.reused = true;
            size_t keep = 0;
            for (size_t i = 0; i < freed.pending.size(); ++i) {
                const Record rec = freed.pending[i];
                if (rec.start < r.stop && r.start < rec.stop) {
                    if (clock_get(*clock, rec.owner) < rec.tick) {
                        occurrences.push_back(
                            Occurrence{rec.op, index_, freed.op, FREE, rec.owner, freed.owner, freed.alloc});
                    }
                    if (r.start <= rec.start && rec.stop <= r.stop) continue;  // its bytes have a new owner: checked once
                }
                freed.pending[keep++] = rec;
            }
            freed.pending.resize(keep);
            if (keep == 0) freed_.erase(found);
        }
        return OK;
    }

    Status free_(PyObject* op, int32_t thread) {
        int64_t id;
        if (!attr_int(op, s_buffer, &id)) return SWITCH;
        int32_t slot = buffer_ids_.get(id);
        if (slot < 0 || buffers_[size_t(slot)].freed) return SWITCH;  // unknown, or use after free
        bool has_stream, strict;
        int64_t stream_id;
        if (!attr_opt_int(op, s_stream, &has_stream, &stream_id)) return SWITCH;
        PyObject* also = attr_tuple(op, s_also);
        if (also == nullptr) return SWITCH;
        // hb.py looks the record_stream streams up where it uses them; unknown ones switch here, first.
        std::vector<int32_t> others;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(also); ++i) {
            int64_t other_id;
            int32_t other = read_int(PyTuple_GET_ITEM(also, i), &other_id) ? stream_ids_.get(other_id) : -1;
            others.push_back(other);
        }
        Py_DECREF(also);
        if (!attr_truth(op, s_strict, &strict)) return SWITCH;
        const Clock* clock;
        uint32_t owner;
        uint64_t tick;
        Clock joined;
        if (!has_stream) {
            Thread& actor = threads_[size_t(thread)];
            tick = host_tick(thread);
            clock = &actor.clock;
            owner = actor.owner;
        } else {
            int32_t stream = stream_ids_.get(stream_id);
            if (stream < 0) return SWITCH;
            for (int32_t other : others) {
                if (other < 0) return SWITCH;
            }
            tick = issue(thread, stream);
            Stream& actor = streams_[size_t(stream)];
            clock = &actor.clock;
            owner = actor.owner;
            if (!others.empty()) {  // record_stream: reuse also waits for what those streams issued so far
                joined = actor.clock;
                for (int32_t other : others) clock_join(joined, streams_[size_t(other)].clock);
                clock = &joined;
            }
        }
        Buffer& buf = buffers_[size_t(slot)];
        if (strict) {
            access(buf, 0, buf.nbytes, true, *clock, owner, tick, true);
        } else if (!buf.records.empty()) {
            // Not a race yet: kept for the allocation that gets these bytes, less what record_stream's
            // events cover; a use the free's actor was not ordered after either is a hazard.
            Clock guard;
            for (int32_t other : others) {
                if (other < 0) return SWITCH;
                clock_join(guard, streams_[size_t(other)].clock);
            }
            std::vector<Record> pending;
            for (const Record& rec : buf.records) {
                if (clock_get(guard, rec.owner) < rec.tick) pending.push_back(rec);
            }
            if (!pending.empty()) {
                Freed freed;
                freed.op = index_;
                freed.owner = owner;
                freed.alloc = buf.alloc;
                for (const Record& rec : pending) {
                    if (clock_get(*clock, rec.owner) < rec.tick) freed.unordered.push_back(rec);
                }
                freed.pending = std::move(pending);
                freed_[id] = std::move(freed);
            }
        }
        buf.freed = true;
        buf.records.clear();
        return OK;
    }

    Status launch(PyObject* op, int32_t thread, bool kernel) {
        int32_t stream = stream_of(op);
        if (stream < 0) return SWITCH;
        spans_.clear();
        size_t n_reads;
        if (kernel) {
            PyObject* reads = attr_tuple(op, s_reads);
            if (reads == nullptr) return SWITCH;
            bool ok = ranges(reads);
            Py_DECREF(reads);
            if (!ok) return SWITCH;
            n_reads = spans_.size();
            PyObject* writes = attr_tuple(op, s_writes);
            if (writes == nullptr) return SWITCH;
            ok = ranges(writes);
            Py_DECREF(writes);
            if (!ok) return SWITCH;
        } else {  // Copy: src is its read, dst its write (None: host memory)
            PyObject* src = PyObject_GetAttr(op, s_src);
            if (src == nullptr) {
                PyErr_Clear();
                return SWITCH;
            }
            bool ok = src == Py_None || range(src);
            Py_DECREF(src);
            if (!ok) return SWITCH;
            n_reads = spans_.size();
            PyObject* dst = PyObject_GetAttr(op, s_dst);
            if (dst == nullptr) {
                PyErr_Clear();
                return SWITCH;
            }
            ok = dst == Py_None || range(dst);
            Py_DECREF(dst);
            if (!ok) return SWITCH;
        }
        if (kernel && multi_) {
            // A kernel touching another device's memory faults without peer access (hb.py collects it).
            int64_t here = devices_[size_t(streams_[size_t(stream)].device)].index;
            for (const Span& span : spans_) {
                if (buffers_[size_t(span.buffer)].device != here) return SWITCH;
            }
        }
        uint64_t tick = issue(thread, stream);
        const Stream& s = streams_[size_t(stream)];
        for (size_t i = 0; i < spans_.size(); ++i) {
            const Span& span = spans_[i];
            access(buffers_[size_t(span.buffer)], span.start, span.stop, i >= n_reads, s.clock, s.owner, tick, false);
        }
        return OK;
    }

    Status host_access(PyObject* op, int32_t thread) {
        spans_.clear();
        PyObject* reads = attr_tuple(op, s_reads);
        if (reads == nullptr) return SWITCH;
        bool ok = ranges(reads);
        Py_DECREF(reads);
        if (!ok) return SWITCH;
        size_t n_reads = spans_.size();
        PyObject* writes = attr_tuple(op, s_writes);
        if (writes == nullptr) return SWITCH;
        ok = ranges(writes);
        Py_DECREF(writes);
        if (!ok) return SWITCH;
        uint64_t tick = host_tick(thread);
        const Thread& t = threads_[size_t(thread)];
        for (size_t i = 0; i < spans_.size(); ++i) {
            const Span& span = spans_[i];
            access(buffers_[size_t(span.buffer)], span.start, span.stop, i >= n_reads, t.clock, t.owner, tick, false);
        }
        return OK;
    }

    // --- the race check ----------------------------------------------------------------------
    void access(Buffer& buf, int64_t start, int64_t stop, bool write, const Clock& clock, uint32_t owner,
                uint64_t tick, bool free) {
        if (start >= stop) return;
        std::vector<Record>& records = buf.records;
        size_t keep = 0;
        const size_t n = records.size();
        for (size_t i = 0; i < n; ++i) {
            const Record rec = records[i];
            if (rec.start < stop && start < rec.stop) {
                if (clock_get(clock, rec.owner) >= rec.tick) {  // ordered before this access
                    // Drop what this access subsumes: an ordered earlier access to bytes it covers can
                    // only race with something that also races with this one.
                    if ((write || !rec.write) && start <= rec.start && rec.stop <= stop) continue;
                } else if (write || rec.write) {
                    Kind kind = free ? FREE : (rec.write ? (write ? WAW : RAW) : WAR);
                    occurrences.push_back(Occurrence{rec.op, index_, index_, kind, rec.owner, owner, buf.alloc});
                }
            }
            records[keep++] = rec;
        }
        records.resize(keep);
        records.push_back(Record{start, stop, tick, index_, owner, write});
    }
};

// --- the Python type ---------------------------------------------------------------------------

struct CheckerObject {
    PyObject_HEAD
    Core* core;          // nullptr once hb.Checker took over
    PyObject* ops;       // every operation fed while native: the replay list
    PyObject* reference; // the hb.Checker that took over, or nullptr
    PyObject* reference_feed;
};

int checker_traverse(CheckerObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->ops);
    Py_VISIT(self->reference);
    Py_VISIT(self->reference_feed);
    return 0;
}

int checker_clear(CheckerObject* self) {
    Py_CLEAR(self->ops);
    Py_CLEAR(self->reference);
    Py_CLEAR(self->reference_feed);
    return 0;
}

void checker_dealloc(CheckerObject* self) {
    PyTypeObject* type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    checker_clear(self);
    delete self->core;
    self->core = nullptr;
    type->tp_free(reinterpret_cast<PyObject*>(self));
    Py_DECREF(type);
}

PyObject* checker_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    if (g_parse_kind == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "streamcheck's native checker is not configured (streamcheck.core.fast does that)");
        return nullptr;
    }
    CheckerObject* self = reinterpret_cast<CheckerObject*>(type->tp_alloc(type, 0));
    if (self == nullptr) return nullptr;
    self->ops = PyList_New(0);
    if (self->ops == nullptr) {
        Py_DECREF(self);
        return nullptr;
    }
    try {
        self->core = new Core();
    } catch (const std::bad_alloc&) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return reinterpret_cast<PyObject*>(self);
}

PyObject* checker_feed(CheckerObject* self, PyObject* op) {
    if (self->reference_feed != nullptr) return PyObject_CallOneArg(self->reference_feed, op);
    if (self->core == nullptr || self->ops == nullptr) {  // only while _switch hands over, from another thread
        PyErr_SetString(PyExc_RuntimeError, "native checker: fed while handing over to hb.Checker");
        return nullptr;
    }
    if (PyList_Append(self->ops, op) < 0) return nullptr;
    Core& core = *self->core;
    size_t before = core.occurrences.size();
    Status status;
    try {
        status = core.feed(op, uint64_t(PyList_GET_SIZE(self->ops) - 1));
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    }
    if (status == OK) Py_RETURN_NONE;
    // hb.py takes over with this operation (which it may refuse with TraceError): what the native side
    // saw of it is dropped, so the occurrences cover exactly the operations before it.
    core.occurrences.resize(before);
    PyObject* reference = PyObject_CallMethodOneArg(reinterpret_cast<PyObject*>(self), s_switch, Py_True);
    if (reference == nullptr) return nullptr;
    Py_DECREF(reference);
    Py_RETURN_NONE;
}

PyObject* checker_take_ops(CheckerObject* self, PyObject*) {
    if (self->ops == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "native checker: the operations were handed over already");
        return nullptr;
    }
    PyObject* ops = self->ops;
    self->ops = nullptr;
    return ops;
}

// Hand everything over to `reference` (an hb.Checker fed the same operations) and drop the native state.
PyObject* checker_hand_over(CheckerObject* self, PyObject* reference) {
    PyObject* feed = PyObject_GetAttrString(reference, "feed");
    if (feed == nullptr) return nullptr;
    Py_INCREF(reference);
    Py_XSETREF(self->reference, reference);
    Py_XSETREF(self->reference_feed, feed);
    delete self->core;
    self->core = nullptr;
    Py_RETURN_NONE;
}

PyObject* checker_occurrences(CheckerObject* self, PyObject* args) {
    Py_ssize_t start, stop = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "n|n", &start, &stop)) return nullptr;
    if (self->core == nullptr) return PyList_New(0);
    const std::vector<Occurrence>& all = self->core->occurrences;
    size_t to = std::min<size_t>(size_t(std::max<Py_ssize_t>(stop, 0)), all.size());
    size_t from = std::min<size_t>(size_t(std::max<Py_ssize_t>(start, 0)), to);
    PyObject* out = PyList_New(Py_ssize_t(to - from));
    if (out == nullptr) return nullptr;
    for (size_t i = from; i < to; ++i) {
        const Occurrence& o = all[i];
        // Built field by field: a racy loop reads thousands (Py_BuildValue parses its format each time).
        PyObject* fields[] = {PyLong_FromUnsignedLongLong(o.first),       PyLong_FromUnsignedLongLong(o.second),
                              PyLong_FromUnsignedLongLong(o.key_second),  kind_name(o.kind),
                              PyLong_FromUnsignedLong(o.first_owner),     PyLong_FromUnsignedLong(o.second_owner),
                              PyLong_FromUnsignedLongLong(o.alloc)};
        PyObject* item = PyTuple_New(7);
        bool ok = item != nullptr;
        for (int f = 0; f < 7; ++f) {
            ok = ok && fields[f] != nullptr;
            if (item != nullptr) {
                PyTuple_SET_ITEM(item, f, fields[f]);  // steals (a null one is cleared with the tuple)
            } else {
                Py_XDECREF(fields[f]);
            }
        }
        if (!ok) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return nullptr;
        }
        PyList_SET_ITEM(out, Py_ssize_t(i - from), item);
    }
    return out;
}

PyObject* checker_occurrence_count(CheckerObject* self, void*) {
    return PyLong_FromSize_t(self->core != nullptr ? self->core->occurrences.size() : 0);
}

// A dense clock as hb.py's dict, less its zero components (an owner at 0 orders nothing).
PyObject* clock_dict(const Clock& clock) {
    PyObject* out = PyDict_New();
    if (out == nullptr) return nullptr;
    for (size_t owner = 0; owner < clock.size(); ++owner) {
        if (clock[owner] == 0) continue;
        PyObject* key = PyLong_FromSize_t(owner);
        PyObject* value = PyLong_FromUnsignedLongLong(clock[owner]);
        int status = key != nullptr && value != nullptr ? PyDict_SetItem(out, key, value) : -1;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (status != 0) {
            Py_DECREF(out);
            return nullptr;
        }
    }
    return out;
}

PyObject* checker_sync_clocks(CheckerObject* self, PyObject* op) {
    Clock needed, have;
    uint32_t ordered = 0;
    int64_t source = -1;
    if (self->core == nullptr || !self->core->sync_clocks(op, needed, have, ordered, source)) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_NONE;
    }
    PyObject* source_object = source >= 0 ? PyLong_FromLongLong(source) : Py_NewRef(Py_None);
    return Py_BuildValue("(NNIN)", clock_dict(needed), clock_dict(have), ordered, source_object);
}

PyObject* checker_thread_owner(CheckerObject* self, PyObject* arg) {
    long long id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred()) return nullptr;
    int64_t owner = self->core != nullptr ? self->core->thread_owner(id) : -1;
    if (owner < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(owner);
}

PyObject* checker_has_hazards(CheckerObject* self, PyObject*) {
    return PyBool_FromLong(self->core != nullptr && self->core->has_hazards());
}

PyObject* checker_ops(CheckerObject* self, void*) {
    PyObject* ops = self->ops != nullptr ? self->ops : Py_None;
    Py_INCREF(ops);
    return ops;
}

PyObject* checker_reference(CheckerObject* self, void*) {
    PyObject* reference = self->reference != nullptr ? self->reference : Py_None;
    Py_INCREF(reference);
    return reference;
}

PyMethodDef checker_methods[] = {
    {"feed", reinterpret_cast<PyCFunction>(checker_feed), METH_O,
     "Check one operation (issue order). An operation the native side does not model makes hb.Checker take over."},
    {"_take_ops", reinterpret_cast<PyCFunction>(checker_take_ops), METH_NOARGS,
     "The operations fed so far (the replay list); the native side keeps no list after this."},
    {"_hand_over", reinterpret_cast<PyCFunction>(checker_hand_over), METH_O,
     "From now on every call goes to this hb.Checker (fed the same operations); the native state is dropped."},
    {"_occurrences", reinterpret_cast<PyCFunction>(checker_occurrences), METH_VARARGS,
     "Race occurrences [start:stop] (stop: the end by default): (first op, second op, op of the key's second site, kind, first "
     "owner, second owner, the buffer's allocating op), operations as indices of the fed list."},
    {"_sync_clocks", reinterpret_cast<PyCFunction>(checker_sync_clocks), METH_O,
     "hb.Checker.sync_clocks of a synchronization not fed yet, its clocks without zero components; None where hb's is."},
    {"_thread_owner", reinterpret_cast<PyCFunction>(checker_thread_owner), METH_O,
     "hb.Checker.thread_owner: the clock owner of a host thread, None if it has not started."},
    {"_has_hazards", reinterpret_cast<PyCFunction>(checker_has_hazards), METH_NOARGS,
     "Whether a pending free's bytes went to no allocation (hb.Checker.hazards is not empty)."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef checker_getset[] = {
    {"_occurrence_count", reinterpret_cast<getter>(checker_occurrence_count), nullptr,
     "How many race occurrences the native side found.", nullptr},
    {"_ops", reinterpret_cast<getter>(checker_ops), nullptr,
     "The operations fed while native (the replay list), or None once handed over.", nullptr},
    {"_reference", reinterpret_cast<getter>(checker_reference), nullptr,
     "The hb.Checker that took over, or None while native.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot checker_slots[] = {
    {Py_tp_doc, const_cast<char*>("hb.Checker's vector clocks and shadow records in C++ (see streamcheck.core.fast).")},
    {Py_tp_new, reinterpret_cast<void*>(checker_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(checker_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(checker_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(checker_clear)},
    {Py_tp_methods, checker_methods},
    {Py_tp_getset, checker_getset},
    {0, nullptr},
};

PyType_Spec checker_spec = {
    "streamcheck.core._checker_native.Checker",
    sizeof(CheckerObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    checker_slots,
};

// configure(op types, stream kinds, StreamKind.parse): the trace classes in OpType's order and the
// StreamKind members in StreamKindIndex's, which this module compares by identity.
PyObject* configure(PyObject*, PyObject* args) {
    PyObject *types, *kinds, *parse;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &types, &PyTuple_Type, &kinds, &parse)) return nullptr;
    if (PyTuple_GET_SIZE(types) != N_OP_TYPES || PyTuple_GET_SIZE(kinds) != N_KINDS) {
        PyErr_Format(PyExc_ValueError, "configure: expected %d operation types and %d stream kinds", int(N_OP_TYPES),
                     int(N_KINDS));
        return nullptr;
    }
    for (int i = 0; i < N_OP_TYPES; ++i) {
        PyObject* type = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(type)) {
            PyErr_SetString(PyExc_TypeError, "configure: operation types must be classes");
            return nullptr;
        }
        Py_INCREF(type);
        Py_XSETREF(g_types[i], type);
    }
    for (int i = 0; i < N_KINDS; ++i) {
        Py_INCREF(PyTuple_GET_ITEM(kinds, i));
        Py_XSETREF(g_kinds[i], PyTuple_GET_ITEM(kinds, i));
    }
    Py_INCREF(parse);
    Py_XSETREF(g_parse_kind, parse);
    Py_RETURN_NONE;
}

// Trace records and their Ranges are frozen, and hold only ints, strings, enums and other such records: they can
// never be part of a reference cycle. Off the cyclic GC's lists, its collections stop walking every record of a
// long trace again (20-35 % of recording's time was the GC's: docs/benchmarks.md).
PyObject* untrack(PyObject*, PyObject* obj) {
    if (PyObject_IS_GC(obj)) PyObject_GC_UnTrack(obj);  // (a no-op where it is not tracked)
    Py_INCREF(obj);
    return obj;
}

PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "Tell the module the trace's operation classes and stream kinds."},
    {"untrack", untrack, METH_O, "Take an immutable, acyclic trace record off the cyclic GC's lists; return it."},
    {nullptr, nullptr, 0, nullptr},
};

int intern_names() {
    struct {
        PyObject** slot;
        const char* name;
    } names[] = {
        {&s_thread, "thread"}, {&s_parent, "parent"}, {&s_child, "child"}, {&s_channel, "channel"},
        {&s_stream, "stream"}, {&s_kind, "kind"}, {&s_device, "device"}, {&s_event, "event"}, {&s_done, "done"},
        {&s_buffer, "buffer"}, {&s_nbytes, "nbytes"}, {&s_reuses, "reuses"}, {&s_also, "also"},
        {&s_strict, "strict"}, {&s_reads, "reads"}, {&s_writes, "writes"}, {&s_src, "src"}, {&s_dst, "dst"},
        {&s_start, "start"}, {&s_stop, "stop"}, {&s_switch, "_switch"},
    };
    for (auto& entry : names) {
        if (*entry.slot == nullptr) {
            *entry.slot = PyUnicode_InternFromString(entry.name);
            if (*entry.slot == nullptr) return -1;
        }
    }
    return 0;
}

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_checker_native",
    "The happens-before checker's hot core in C++ (streamcheck.core.fast wraps it; hb.py is the reference).", -1,
    module_methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__checker_native(void) {
    if (intern_names() < 0) return nullptr;
    PyObject* module = PyModule_Create(&module_def);
    if (module == nullptr) return nullptr;
#ifdef SOURCE_SHA256
    if (PyModule_AddStringConstant(module, "SOURCE_SHA256", SOURCE_SHA256) < 0) {  // setup.py's hash of this file
        Py_DECREF(module);
        return nullptr;
    }
#endif
    PyObject* type = PyType_FromSpec(&checker_spec);
    if (type == nullptr || PyModule_AddObject(module, "Checker", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return nullptr;
    }
    return module;
}
