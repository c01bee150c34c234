/* The probe's hot path in C: the same ring writes as writer.py's Python wrapper, without the interpreter.
 *
 * Why: around a real row fetch (a gather of hundreds of KB that evicts the caches) the Python wrapper added
 * 1.3-3.0 us per call, most of it the interpreter's own objects (frames, globals, the struct packer) missed
 * in cache after the gather; the target is 1 us. This file does exactly what writer._exact_wrapper's body does,
 * in the same order and with the same ring layout (ring.py's module doc has the writer protocol); for a GPU
 * timer registered with gpu_setup it also does GpuTimer.end's common cases (see "The GPU timer's hot path"
 * below). native.py builds it at first use with the interpreter's own compiler into a private cache directory and
 * falls back to the Python wrapper wherever that fails; it is never required.
 *
 * Module functions:
 *   set_ring(buffer, mask, shift, header_slots)  the ring to write (a writable buffer, held until cleared);
 *                                                resets the call counter (a new ring starts at call 1)
 *   clear_ring()                                 forget the ring (reset, or a forked child)
 *   next_call()                                  the process-wide call counter (writer._NEXT uses it too)
 *   Wrapper(fn, tidx, pos, kw, mode, probe_globals, ensure_ring)
 *       a callable that times each call of fn: mode 0 none, 1 len, 2 numel, 3 dim0 of argument pos (or keyword
 *       kw); probe_globals is writer.py's module dict (its _GPU, read each call, as the Python wrapper does)
 *   gpu_setup(timer, captures, key_fn, key_arg, record_addr, exact_arg, window_ns, limit)
 *                                                take that GpuTimer's hot path (GpuTimer._fast's setter)
 *   gpu_clear(timer or None)                     give it back (GpuTimer.stop; None: whichever, a forked child)
 *   gpu_drain(timer, streams)                    move the calls waiting here into the timer's stream lists
 *   gpu_arm(key, perf_ns) / gpu_disarm(key)      a stream recorded an event / has nothing unresolved left
 *   gpu_pending(), gpu_set_queued(n)             the calls waiting here; the timer's queued count (its bound)
 *   GraphWrapper(fn, tidx, pos, kw, graph_globals, ensure_ring, decide)
 *       a callable that times each CUDA graph replay fn(self, shape_key, ...) (graph.py's wrapper; see "CUDA graph
 *       replays" below)
 *   graph_setup(timer, captures, key_fn, key_arg, record, query, create, capturing, limit, prefill, always)
 *                                                take the replay timer's hot path and its events (graph.py;
 *                                                always: a start event before every replay, see below)
 *   graph_clear(timer or None), graph_poll(now), graph_stats(), graph_before(),
 *   graph_after(stream, ev, prev, b, c)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#define W_END 3
#define W_GPU 7
#define END_BITS 48
#define END_MASK ((((uint64_t)1) << END_BITS) - 1)
#define LAP_MASK 0x7FFF
#define GPU_NONE 0
#define GPU_QUEUED 1

static Py_buffer ring_view;
static int64_t *ring_words = NULL; /* NULL: no ring (the wrapper asks writer._ensure_ring) */
static uint64_t ring_mask = 0;
static int ring_shift = 0;
static uint64_t ring_header_slots = 0;
static uint64_t counter = 0;
static uint64_t ring_nbytes = 0; /* the buffer's length: the GPU side area lies past the slots */

static PyTypeObject *numel_type = NULL; /* the type numel_descr belongs to (the last sized argument's) */
static PyObject *numel_descr = NULL;
static PyObject *str_numel = NULL, *str_shape = NULL, *str_gpu = NULL, *str_end = NULL;
static PyObject *str_streams = NULL, *str_groups = NULL, *str_last = NULL,
                *str_queued = NULL, *str_open = NULL, *str_free = NULL, *str_cuda_event = NULL,
                *str_append = NULL, *str_recorded = NULL;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns(): the same clock the reader and the Python path use */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t perf_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter_ns(): the clock of GpuTimer's last_rec_ns */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t take_call(void) { return __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED); }

static PyObject *set_ring(PyObject *mod, PyObject *args) {
    PyObject *buf;
    unsigned long long mask, header_slots;
    int shift;
    if (!PyArg_ParseTuple(args, "OKiK", &buf, &mask, &shift, &header_slots)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) return NULL;
    if ((uint64_t)view.len < (header_slots + mask + 1) * 64) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "ring buffer smaller than its slots");
        return NULL;
    }
    if (ring_words != NULL) PyBuffer_Release(&ring_view);
    ring_view = view;
    ring_words = (int64_t *)view.buf;
    ring_nbytes = (uint64_t)view.len;
    ring_mask = mask;
    ring_shift = shift;
    ring_header_slots = header_slots;
    counter = 0;
    Py_RETURN_NONE;
}

static PyObject *clear_ring(PyObject *mod, PyObject *unused) {
    if (ring_words != NULL) {
        ring_words = NULL;
        PyBuffer_Release(&ring_view);
    }
    Py_RETURN_NONE;
}

static PyObject *next_call(PyObject *mod, PyObject *unused) { return PyLong_FromUnsignedLongLong(take_call()); }

/* ---- What both wrapper types share -------------------------------------------------------------------------
 *
 * Wrapper (eager calls) and GraphWrapper (CUDA graph replays) time one call into one ring slot the same way: the
 * ring made on the first call, a call number and its slot, the slot opened before the call and its end stored
 * after it, the wrapped callable bound as a method, its attributes kept for functools.update_wrapper. Each type
 * starts with a ProbeWrapper (its first member, so a pointer to either is one to its ProbeWrapper) and uses the
 * functions below; what differs is the gather size (pw_arg's argument read as a size or a shape key) and the timer
 * asked around the call. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;
    PyObject *kw;      /* the sized argument's (or shape key's) name, or None */
    PyObject *globals; /* the module dict read each call: writer.py's (_GPU) or graph.py's (_TIMER, _DECIDED) */
    PyObject *ensure;  /* writer._ensure_ring */
    PyObject *dict;    /* functools.update_wrapper's attributes */
    Py_ssize_t pos;
    int tidx;
} ProbeWrapper;

/* Whether there is a ring to write, made on the first call (writer._ensure_ring) where there is none yet; 0: the
 * call runs untimed. */
static inline int pw_ring(ProbeWrapper *w) {
    if (ring_words != NULL) return 1;
    PyObject *ok = PyObject_CallNoArgs(w->ensure);
    int yes = ok != NULL && PyObject_IsTrue(ok) == 1;
    Py_XDECREF(ok);
    if (PyErr_Occurred()) PyErr_Clear();
    return yes && ring_words != NULL;
}

/* The argument at position pos, else the keyword kw (borrowed); NULL: the call has neither. */
static inline PyObject *pw_arg(ProbeWrapper *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->pos >= 0 && w->pos < nargs) return args[w->pos];
    if (kwnames == NULL || w->kw == Py_None) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == w->kw || PyUnicode_Compare(name, w->kw) == 0) return args[nargs + i];
    }
    return NULL;
}

/* One call's slot: the ring it was taken in, its call number, its first word and the lap its end is tagged with. */
typedef struct {
    int64_t *words;
    int64_t *slot;
    uint64_t c, b, lap;
} pw_call;

static inline pw_call pw_take(void) {
    pw_call k;
    k.words = ring_words;
    k.c = take_call();
    k.b = ((k.c & ring_mask) + ring_header_slots) << 3; /* the slot's first word */
    k.slot = k.words + k.b;
    k.lap = ((k.c >> ring_shift) & LAP_MASK) << END_BITS;
    return k;
}

/* The slot opened (ring.py's writer protocol): started now, end 0 while the call is in flight. */
static inline void pw_open(const pw_call *k, int64_t gs, int64_t tword, int64_t gpu_state) {
    int64_t *slot = k->slot;
    __atomic_store_n(&slot[0], (int64_t)(2 * k->c + 1), __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    slot[1] = (int64_t)k->c;
    slot[2] = now_ns();
    slot[W_END] = 0;
    slot[4] = gs;
    slot[5] = (int64_t)PyThread_get_thread_ident();
    slot[6] = tword;
    slot[W_GPU] = gpu_state;
    __atomic_store_n(&slot[0], (int64_t)(2 * k->c + 2), __ATOMIC_RELEASE);
}

/* The call untimed on the GPU (its timer could not queue it), where its ring is still the one written. */
static inline void pw_untimed(const pw_call *k) {
    if (ring_words == k->words) k->words[k->b + W_GPU] = GPU_NONE;
}

/* The blind end store with the call's lap (ring.py's module doc); a ring replaced meanwhile is not written. */
static inline void pw_close(const pw_call *k) {
    if (ring_words == k->words)
        __atomic_store_n(&k->slot[W_END], (int64_t)(k->lap | ((uint64_t)now_ns() & END_MASK)), __ATOMIC_RELEASE);
}

/* timer.name(b, c), or timer.name(lead, b, c) where lead is given: a Python timer's end() or after(). */
static PyObject *pw_call_timer(PyObject *timer, PyObject *name, PyObject *lead, uint64_t b, uint64_t c) {
    PyObject *r = NULL;
    PyObject *pb = PyLong_FromUnsignedLongLong(b), *pc = PyLong_FromUnsignedLongLong(c);
    if (pb != NULL && pc != NULL) {
        PyObject *argv[4] = {timer, lead, pb, pc};
        if (lead == NULL) {
            argv[1] = pb;
            argv[2] = pc;
        }
        r = PyObject_VectorcallMethod(name, argv, lead == NULL ? 3 : 4, NULL);
    }
    Py_XDECREF(pb);
    Py_XDECREF(pc);
    return r;
}

/* A new wrapper of either type with the shared fields set (new references); the caller sets its own. */
static ProbeWrapper *pw_new(PyTypeObject *type, vectorcallfunc call, PyObject *fn, PyObject *kw, PyObject *globals,
                            PyObject *ensure, Py_ssize_t pos, int tidx) {
    ProbeWrapper *w = (ProbeWrapper *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->vectorcall = call;
    w->fn = Py_NewRef(fn);
    w->kw = Py_NewRef(kw);
    w->globals = Py_NewRef(globals);
    w->ensure = Py_NewRef(ensure);
    w->dict = NULL;
    w->pos = pos;
    w->tidx = tidx;
    return w;
}

static int pw_traverse(ProbeWrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->fn);
    Py_VISIT(w->kw);
    Py_VISIT(w->globals);
    Py_VISIT(w->ensure);
    Py_VISIT(w->dict);
    return 0;
}

static int pw_clear(ProbeWrapper *w) {
    Py_CLEAR(w->fn);
    Py_CLEAR(w->kw);
    Py_CLEAR(w->globals);
    Py_CLEAR(w->ensure);
    Py_CLEAR(w->dict);
    return 0;
}

static void pw_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self); /* the type's own clear: the shared fields and its own */
    Py_TYPE(self)->tp_free(self);
}

/* A method wrapped on its class is bound like the function it replaces. */
static PyObject *pw_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *pw_fn(ProbeWrapper *w, void *closure) { return Py_NewRef(w->fn); }

static PyGetSetDef pw_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"probed_function", (getter)pw_fn, NULL, "the wrapped callable", NULL},
    {NULL},
};

/* The slots both types fill alike, set before PyType_Ready (each type object names only what is its own). */
static int pw_type_ready(PyTypeObject *type) {
    type->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
    type->tp_dealloc = pw_dealloc;
    type->tp_call = PyVectorcall_Call;
    type->tp_vectorcall_offset = offsetof(ProbeWrapper, vectorcall);
    type->tp_descr_get = pw_descr_get;
    type->tp_dictoffset = offsetof(ProbeWrapper, dict);
    type->tp_getset = pw_getset;
    return PyType_Ready(type);
}

typedef struct {
    ProbeWrapper base;
    int mode;
} Wrapper;

static int64_t gather_size(Wrapper *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (w->mode == 0) return -1;
    PyObject *obj = pw_arg(&w->base, args, nargs, kwnames);
    if (obj == NULL) return -1;
    int64_t gs = -1;
    if (w->mode == 1) {
        Py_ssize_t n = PyObject_Length(obj);
        gs = n;
    } else {
        PyObject *r = NULL;
        if (w->mode == 2) {
            /* the type's own numel, looked up once per type: no instance attribute lookup per call */
            if (Py_TYPE(obj) != numel_type) {
                PyObject *d = PyObject_GetAttr((PyObject *)Py_TYPE(obj), str_numel);
                if (d != NULL && PyCallable_Check(d)) {
                    Py_XSETREF(numel_descr, d);
                    Py_XSETREF(numel_type, (PyTypeObject *)Py_NewRef(Py_TYPE(obj)));
                } else {
                    Py_XDECREF(d);
                    PyErr_Clear();
                }
            }
            if (Py_TYPE(obj) == numel_type) {
                r = PyObject_Vectorcall(numel_descr, &obj, 1, NULL);
            } else {
                r = PyObject_CallMethodNoArgs(obj, str_numel);
            }
        } else if (w->mode == 3) {
            PyObject *shape = PyObject_GetAttr(obj, str_shape);
            if (shape != NULL) {
                r = PySequence_GetItem(shape, 0);
                Py_DECREF(shape);
            }
        }
        if (r != NULL) {
            gs = PyLong_AsLongLong(r);
            Py_DECREF(r);
        }
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        gs = -1;
    }
    return gs;
}

typedef int (*record_fn)(void *event, void *stream); /* cudaEventRecord's signature */

/* The GPU timer's hot path (gpu.GpuTimer.end) without entering the interpreter, for the timer registered by
 * gpu_setup (gpu.py does it where the capture hooks are in place and the stream key is a builtin).
 *
 * Why: on the H200 hosts measured (bench/gpu/writer_cost.py), GpuTimer.end cost about 1 us per call called from
 * here, and the same work done here on the timer's Python objects still 0.4 us warm and more right after a large
 * gather (attribute and dict lookups, small allocations, each a cache miss once the gather evicted them), against
 * a budget of 2 us per call for GPU timing. So the two cases of nearly every call keep their state here:
 *  - coalesce: a call less than the window after its stream's last event, while that stream has unresolved
 *    events ("armed"), joins the stream's waiting calls: here a pending buffer in C, moved into the stream's
 *    Python list (GpuTimer's state) by gpu_drain, which the timer calls before it reads or changes that state
 *    (its end(), its reader's poll); one GIL holder at a time, so the calls keep their order;
 *  - record: otherwise, on a stream the timer knows, a pooled event is recorded on the stream through the CUDA
 *    runtime's cudaEventRecord (its address given by gpu.py after a round trip) and the stream's waiting calls
 *    become its group, on the timer's Python objects (records are a few per cent of the calls).
 * Everything else (a new stream, an empty pool, a failed record, a capture, a full queue) goes to GpuTimer.end,
 * which calls gpu_arm after it records and the reader gpu_disarm once a stream has no unresolved event left.
 * The stream key is key_fn(key_arg) (key_arg called first where callable): gpu.py passes the raw-stream builtin
 * and the device current at setup, which skips the runtime's current-device query (~270 ns right after a 32-row
 * gather); a call that records checks key_fn(exact_arg) (the thread's current device) and leaves a mismatch to
 * GpuTimer.end. Keys are compared by value (raw stream handles, ints; other objects in tests). */
#define GS_MAX_STREAMS 16
typedef struct {
    PyObject *key;  /* owned */
    int64_t last_rec_ns;
    int armed;
} gs_stream;
static PyObject *gs_timer = NULL, *gs_caps = NULL, *gs_key_fn = NULL, *gs_key_arg = NULL, *gs_exact_arg = NULL;
static uintptr_t gs_record = 0;
static int64_t gs_window = 0, gs_limit = 0, gs_queued = 0;
static gs_stream gs_streams[GS_MAX_STREAMS];
static int gs_nstreams = 0;
static uint64_t *gs_pend = NULL; /* pending calls: (stream index, slot word, call number) triples */
static Py_ssize_t gs_npend = 0, gs_cap = 0;

static int64_t attr_int(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int64_t r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

/* The stream's index, -1 where not known (or an error is set), created where asked. */
static int gs_find(PyObject *key, int create) {
    for (int i = 0; i < gs_nstreams; i++) {
        PyObject *k = gs_streams[i].key;
        int same = PyObject_RichCompareBool(k, key, Py_EQ); /* identity first, then ints by value */
        if (same < 0) return -1;
        if (same) return i;
    }
    if (!create || gs_nstreams == GS_MAX_STREAMS) return -1;
    gs_streams[gs_nstreams].key = Py_NewRef(key);
    gs_streams[gs_nstreams].last_rec_ns = 0;
    gs_streams[gs_nstreams].armed = 0;
    return gs_nstreams++;
}

static PyObject *gs_key(PyObject *arg_src) {
    PyObject *arg = PyCallable_Check(arg_src) ? PyObject_CallNoArgs(arg_src) : Py_NewRef(arg_src);
    if (arg == NULL) return NULL;
    PyObject *key = PyObject_CallOneArg(gs_key_fn, arg);
    Py_DECREF(arg);
    return key;
}

/* Move the pending calls into their streams' Python lists (streams: the timer's dict of stream states); a call
 * whose stream state is gone is marked untimed in its slot. Returns how many were moved, -1 on an error. */
static Py_ssize_t gs_drain_into(PyObject *streams) {
    Py_ssize_t moved = 0, i = 0;
    for (; i < gs_npend; i++) {
        uint64_t idx = gs_pend[3 * i], b = gs_pend[3 * i + 1], c = gs_pend[3 * i + 2];
        PyObject *s = PyDict_GetItemWithError(streams, gs_streams[idx].key);
        if (s == NULL) {
            if (PyErr_Occurred()) break;
            if (ring_words != NULL && (uint64_t)ring_words[b + 1] == c) ring_words[b + W_GPU] = GPU_NONE;
            continue;
        }
        PyObject *open = PyObject_GetAttr(s, str_open);
        if (open == NULL) break;
        PyObject *pb = PyLong_FromUnsignedLongLong(b), *pc = PyLong_FromUnsignedLongLong(c), *item = NULL;
        if (pb != NULL && pc != NULL) item = PyTuple_Pack(2, pb, pc);
        Py_XDECREF(pb);
        Py_XDECREF(pc);
        int bad = item == NULL || PyList_Append(open, item) < 0;
        Py_XDECREF(item);
        Py_DECREF(open);
        if (bad) break;
        moved++;
    }
    if (i < gs_npend) { /* an error: keep what was not moved, in order */
        memmove(gs_pend, gs_pend + 3 * i, (size_t)(gs_npend - i) * 3 * sizeof(uint64_t));
        gs_npend -= i;
        return -1;
    }
    gs_npend = 0;
    return moved;
}

/* 1: the call was queued here (coalesced); 0: not, with *key_out the stream key (a new reference) where it was
 * computed; -1: an error. */
static int gs_coalesce(uint64_t b, uint64_t c, PyObject **key_out) {
    *key_out = NULL;
    if (!PyList_Check(gs_caps) || PyList_GET_SIZE(gs_caps) < 1) return 0;
    long ncap = PyLong_AsLong(PyList_GET_ITEM(gs_caps, 0));
    if (ncap == -1 && PyErr_Occurred()) return -1;
    if (ncap > 0) return 0;
    PyObject *key = gs_key(gs_key_arg);
    if (key == NULL) return -1;
    *key_out = key;
    int i = gs_find(key, 0);
    if (i < 0) return PyErr_Occurred() ? -1 : 0;
    gs_stream *st = &gs_streams[i];
    if (!st->armed || !(perf_ns() - st->last_rec_ns < gs_window) || gs_npend + gs_queued >= gs_limit) return 0;
    if (gs_npend == gs_cap) {
        Py_ssize_t cap = gs_cap ? 2 * gs_cap : 256;
        uint64_t *p = PyMem_RawRealloc(gs_pend, (size_t)cap * 3 * sizeof(uint64_t));
        if (p == NULL) return 0; /* GpuTimer.end queues it */
        gs_pend = p;
        gs_cap = cap;
    }
    gs_pend[3 * gs_npend] = (uint64_t)i;
    gs_pend[3 * gs_npend + 1] = b;
    gs_pend[3 * gs_npend + 2] = c;
    gs_npend++;
    return 1;
}

/* The record case, on the timer's Python objects (see above). 1: recorded and queued; 0: GpuTimer.end decides;
 * -1: an error (the caller clears it and lets GpuTimer.end decide). */
static int gs_record_call(PyObject *g, uint64_t b, uint64_t c, PyObject *key) {
    int res = 0;
    PyObject *streams = NULL, *groups = NULL, *open = NULL, *item = NULL, *nq = NULL, *pool = NULL, *ev = NULL,
             *handle = NULL, *fresh = NULL, *group = NULL, *r = NULL, *stamp = NULL, *nrec = NULL, *exact = NULL,
             *st = NULL;
    if (gs_record == 0) goto done;
    if (gs_exact_arg != Py_None) { /* the event's stream must be the thread's current one */
        exact = gs_key(gs_exact_arg);
        if (exact == NULL) goto fail;
        int same = PyObject_RichCompareBool(exact, key, Py_EQ);
        if (same < 0) goto fail;
        if (!same) goto done;
    }
    streams = PyObject_GetAttr(g, str_streams);
    if (streams == NULL) goto fail;
    if (!PyDict_Check(streams)) goto done;
    int64_t queued = attr_int(g, str_queued);
    if (queued == -1 && PyErr_Occurred()) goto fail;
    if (gs_npend) { /* the waiting calls go into the group this event closes: first into the stream's list */
        Py_ssize_t moved = gs_drain_into(streams);
        if (moved < 0) goto fail;
        queued += moved;
        nq = PyLong_FromLongLong(queued);
        if (nq == NULL || PyObject_SetAttr(g, str_queued, nq) < 0) goto fail;
        Py_CLEAR(nq);
    }
    if (queued >= gs_limit) goto done; /* the timer's _limit, given at gpu_setup (fixed for a timer) */
    st = PyDict_GetItemWithError(streams, key);
    if (st == NULL) {
        if (PyErr_Occurred()) goto fail;
        goto done; /* a new stream: GpuTimer.end makes its state and records its first event */
    }
    Py_INCREF(st);
    groups = PyObject_GetAttr(st, str_groups);
    open = PyObject_GetAttr(st, str_open);
    pool = PyObject_GetAttr(g, str_free);
    if (groups == NULL || open == NULL || pool == NULL) goto fail;
    if (!PyList_Check(open) || !PyList_Check(pool) || PyList_GET_SIZE(pool) == 0) goto done; /* end() makes one */
    Py_ssize_t np = PyList_GET_SIZE(pool);
    ev = Py_NewRef(PyList_GET_ITEM(pool, np - 1));
    handle = PyObject_GetAttr(ev, str_cuda_event);
    if (handle == NULL) goto fail;
    void *h = PyLong_AsVoidPtr(handle);
    if (h == NULL && PyErr_Occurred()) goto fail;
    void *stream = PyLong_AsVoidPtr(key);
    if (stream == NULL && PyErr_Occurred()) goto fail;
    int64_t now = perf_ns();
    if (((record_fn)gs_record)(h, stream) != 0) goto done; /* end() records again, and counts the error */
    if (PyErr_Occurred()) goto fail;                        /* a test's ctypes callback that raised */
    if (PyList_SetSlice(pool, np - 1, np, NULL) < 0) goto fail; /* the event leaves the pool once recorded */
    PyObject *pb = PyLong_FromUnsignedLongLong(b), *pc = PyLong_FromUnsignedLongLong(c);
    if (pb != NULL && pc != NULL) item = PyTuple_Pack(2, pb, pc);
    Py_XDECREF(pb);
    Py_XDECREF(pc);
    fresh = PyList_New(0);
    if (item == NULL || fresh == NULL || PyList_Append(open, item) < 0) goto fail;
    group = PyTuple_Pack(2, ev, open);
    if (group == NULL) goto fail;
    /* the stream's waiting calls become the new group, and a fresh list takes their place */
    if (PyObject_SetAttr(st, str_open, fresh) < 0) goto fail;
    r = PyObject_CallMethodOneArg(groups, str_append, group);
    if (r == NULL) goto fail;
    stamp = PyLong_FromLongLong(now);
    int64_t recorded = attr_int(g, str_recorded);
    if (recorded == -1 && PyErr_Occurred()) goto fail;
    nrec = PyLong_FromLongLong(recorded + 1);
    nq = PyLong_FromLongLong(queued + 1);
    if (stamp == NULL || nrec == NULL || nq == NULL || PyObject_SetAttr(st, str_last, stamp) < 0 ||
        PyObject_SetAttr(g, str_recorded, nrec) < 0 || PyObject_SetAttr(g, str_queued, nq) < 0)
        goto fail;
    int i = gs_find(key, 1);
    if (i >= 0) {
        gs_streams[i].armed = 1;
        gs_streams[i].last_rec_ns = now;
    }
    PyErr_Clear(); /* a full stream table: those streams' calls go through end() */
    res = 1;
done:
    Py_XDECREF(streams);
    Py_XDECREF(groups);
    Py_XDECREF(open);
    Py_XDECREF(item);
    Py_XDECREF(nq);
    Py_XDECREF(pool);
    Py_XDECREF(ev);
    Py_XDECREF(handle);
    Py_XDECREF(fresh);
    Py_XDECREF(group);
    Py_XDECREF(r);
    Py_XDECREF(stamp);
    Py_XDECREF(nrec);
    Py_XDECREF(exact);
    Py_XDECREF(st);
    return res;
fail:
    res = -1;
    goto done;
}

static void gs_forget(void) {
    Py_CLEAR(gs_timer);
    Py_CLEAR(gs_caps);
    Py_CLEAR(gs_key_fn);
    Py_CLEAR(gs_key_arg);
    Py_CLEAR(gs_exact_arg);
    for (int i = 0; i < gs_nstreams; i++) Py_CLEAR(gs_streams[i].key);
    gs_nstreams = 0;
    gs_npend = 0;
    gs_record = 0;
    gs_queued = 0;
}

static PyObject *gpu_setup(PyObject *mod, PyObject *args) {
    PyObject *timer, *caps, *key_fn, *key_arg, *exact_arg;
    unsigned long long addr;
    long long window, limit;
    if (!PyArg_ParseTuple(args, "OO!OOKOLL", &timer, &PyList_Type, &caps, &key_fn, &key_arg, &addr, &exact_arg,
                          &window, &limit))
        return NULL;
    if (!PyCallable_Check(key_fn)) {
        PyErr_SetString(PyExc_TypeError, "key_fn must be callable");
        return NULL;
    }
    gs_forget();
    gs_timer = Py_NewRef(timer);
    gs_caps = Py_NewRef(caps);
    gs_key_fn = Py_NewRef(key_fn);
    gs_key_arg = Py_NewRef(key_arg);
    gs_exact_arg = Py_NewRef(exact_arg);
    gs_record = (uintptr_t)addr;
    gs_window = window;
    gs_limit = limit;
    Py_RETURN_NONE;
}

static PyObject *gpu_clear(PyObject *mod, PyObject *timer) {
    if (timer == Py_None || timer == gs_timer) gs_forget();
    Py_RETURN_NONE;
}

static PyObject *gpu_drain(PyObject *mod, PyObject *args) {
    PyObject *timer, *streams;
    if (!PyArg_ParseTuple(args, "OO", &timer, &streams)) return NULL;
    if (timer != gs_timer) return PyLong_FromLong(0); /* another timer took over: its calls are not this one's */
    if (!PyDict_Check(streams)) {
        PyErr_SetString(PyExc_TypeError, "streams must be a dict");
        return NULL;
    }
    Py_ssize_t n = gs_drain_into(streams);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *gpu_arm(PyObject *mod, PyObject *args) {
    PyObject *key;
    long long at;
    if (!PyArg_ParseTuple(args, "OL", &key, &at)) return NULL;
    int i = gs_find(key, 1);
    if (i < 0) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE; /* a full stream table: that stream's calls go through end() */
    }
    gs_streams[i].armed = 1;
    gs_streams[i].last_rec_ns = at;
    Py_RETURN_TRUE;
}

static PyObject *gpu_disarm(PyObject *mod, PyObject *key) {
    int i = gs_find(key, 0);
    if (i < 0 && PyErr_Occurred()) return NULL;
    if (i >= 0) gs_streams[i].armed = 0;
    Py_RETURN_NONE;
}

static PyObject *gpu_pending(PyObject *mod, PyObject *unused) { return PyLong_FromSsize_t(gs_npend); }

static PyObject *gpu_set_queued(PyObject *mod, PyObject *n) {
    long long v = PyLong_AsLongLong(n);
    if (v == -1 && PyErr_Occurred()) return NULL;
    gs_queued = v;
    Py_RETURN_NONE;
}

static PyObject *wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Wrapper *w = (Wrapper *)self;
    if (!pw_ring(&w->base)) return PyObject_Vectorcall(w->base.fn, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int64_t gs = gather_size(w, args, nargs, kwnames);
    /* writer._GPU, read each call like the Python wrapper's LOAD_GLOBAL (the event timer starts and stops). */
    PyObject *g = PyDict_GetItemWithError(w->base.globals, str_gpu);
    if (g == NULL && PyErr_Occurred()) PyErr_Clear();
    if (g == Py_None) g = NULL;
    Py_XINCREF(g);
    pw_call k = pw_take();
    uint64_t b = k.b, c = k.c;
    pw_open(&k, gs, w->base.tidx, g == NULL ? GPU_NONE : GPU_QUEUED);
    PyObject *res = PyObject_Vectorcall(w->base.fn, args, nargsf, kwnames);
    if (g != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int done = 0;
        if (g == gs_timer) {
            PyObject *key = NULL;
            done = gs_coalesce(b, c, &key);
            if (done == 0 && key != NULL) done = gs_record_call(g, b, c, key);
            Py_XDECREF(key);
        }
        if (done < 0) PyErr_Clear();
        if (done <= 0) {
            PyObject *r = pw_call_timer(g, str_end, NULL, b, c);
            if (r == NULL) {
                PyErr_Clear();
                pw_untimed(&k); /* as end() does */
            }
            Py_XDECREF(r);
        }
        PyErr_Restore(et, ev, tb);
        Py_DECREF(g);
    }
    pw_close(&k);
    return res;
}

static PyObject *wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fn, *kw, *globals, *ensure;
    Py_ssize_t pos;
    int tidx, mode;
    static char *names[] = {"fn", "tidx", "pos", "kw", "mode", "probe_globals", "ensure_ring", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OinOiO!O", names, &fn, &tidx, &pos, &kw, &mode, &PyDict_Type,
                                     &globals, &ensure))
        return NULL;
    if (!PyCallable_Check(fn) || !PyCallable_Check(ensure)) {
        PyErr_SetString(PyExc_TypeError, "fn and ensure_ring must be callable");
        return NULL;
    }
    if (kw != Py_None && !PyUnicode_Check(kw)) {
        PyErr_SetString(PyExc_TypeError, "kw must be a str or None");
        return NULL;
    }
    Wrapper *w = (Wrapper *)pw_new(type, wrapper_vectorcall, fn, kw, globals, ensure, pos, tidx);
    if (w == NULL) return NULL;
    w->mode = mode;
    return (PyObject *)w;
}

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe_native.Wrapper",
    .tp_basicsize = sizeof(Wrapper),
    .tp_doc = "A callable that times each call into the probe ring (see the module source).",
    .tp_new = wrapper_new,
    .tp_traverse = (traverseproc)pw_traverse,
    .tp_clear = (inquiry)pw_clear,
};

/* ---- CUDA graph replays (graph.py) ------------------------------------------------------------------------
 *
 * Why: graph.py's Python wrapper added ~14 us per replay with its two events on an H200 (4 us host-only,
 * bench/gpu/results/2026-12-01-h200-graphs-run1-graph_cost.json), against a 2 us target. Where it went: the
 * wrapper's own Python (the shape key's getattr chain through the backend's runner on every call, a target-word
 * function, packing the arguments into a tuple and a dict; after a graph launch the interpreter's objects are cold), two records through
 * Python (a binding call for the stream key, a Python function and a dict lookup per record, torch's record binding
 * with its device guard), and the reader thread: it resolved every replay in Python, holding the GIL (a query
 * binding call, a tuple, the publish's memoryview stores), and every replay it resolved was time the replaying
 * thread waited for the GIL: the reader's per-replay cost landed on the hot path. Here:
 *  - GraphWrapper does graph_replay_wrapper's body: the ring slot (graph flag and shape key in the target word),
 *    the token count with the runner's width cached per owner (the backend: its runner's captured_req_width and
 *    ragged_verify_mode are fixed at the runner's construction in SGLang 0.5.23), graph.py's _TIMER / _DECIDED read
 *    from its module dict each call;
 *  - for the timer registered by graph_setup (graph.py's NativeReplayTimer): the capture test (the hooks' count,
 *    and cudaStreamIsCapturing on the stream where given), plain events from a pool of this file's own
 *    (cudaEventCreateWithFlags, disable-timing) recorded with cudaEventRecord on the current raw stream (an end
 *    event after every replay, a start event before it only where needed: below), and the entry queued here (a
 *    single-producer queue: producers hold the GIL);
 *  - graph_poll, called by graph.py's reader thread, queries the events with the GIL released (cudaEventQuery)
 *    and publishes what it found with the GIL held (a few stores per replay), as ReplayTimer.poll does: per stream
 *    in launch order, done (end event completed), started (the first one not done, once its start is known),
 *    queued.
 *
 * One event per replay in steady state. The two cudaEventRecord calls were most of the C path's cost with events
 * (~2.4 us added per replay against ~0.5 us host only, bench/gpu/results/2026-12-01-h200-graphs-run8-graph_cost.json).
 * A replay records its start event only where the previous timed replay on its stream has already been seen done
 * by the reader (or none is queued there, or it was dropped); otherwise (the host runs ahead of the GPU: the
 * previous replay is still queued or unresolved) it records only its end event, and its start is bounded by the
 * previous replay's end on that stream (entry field prev): it counts as started once that entry is seen done (in
 * the same poll or an earlier one), from max(its host launch (slot word 2), when that end was seen done). This is
 * gpu.py's bound for eager calls ("the next call's start bound is when the previous event completed"). Why it is
 * safe for the in-flight rule (a replay whose end has not completed 3 s after its start): that start is never
 * earlier than the host launch nor than the previous replay's end, so an idle gap never ages a replay; work
 * launched between two replays on the same stream that is not a replay (the sampling, the eager parts of a step)
 * counts into the next replay's time, which is milliseconds against the 3 s threshold; and the start is seen at
 * the poll after the previous end completed, up to one poll period (20 ms) late. Where the previous entry was
 * dropped (a query failed) its follower has no start knowledge: it stays queued until its own end completes
 * (never started from an invented start). The hot path decides from cheap state only: per stream (the last
 * GT_STREAMS streams that replayed), the last entry it queued and whether the reader has consumed it; no query.
 * A stream not in that table records its start event (two events: the exact start). graph_setup's always (graph.py:
 * SGLSEAT_PROBE_GRAPH_START_EVENTS=always) records both events before and after every replay, as before;
 * graph_stats counts start events recorded ("start_events") and starts bounded by the previous end
 * ("start_shared").
 *
 * Any other timer (tests' fakes, a Python ReplayTimer) is called through its before()/after() as the Python
 * wrapper calls it. */
typedef int (*query_fn)(void *event);
typedef int (*create_fn)(void **event, unsigned int flags);
typedef int (*capturing_fn)(void *stream, int *status);

#define GT_DONE 3
#define GT_STARTED 2
#define GT_QUEUED 1
#define GT_DROPPED 4 /* an entry's outcome: a query on its stream failed (its slot went untimed) */
#define GT_MAX_BLOCKED 64
#define GT_STREAMS 8

typedef struct {
    void *stream, *ev0, *ev1; /* ev0 NULL: no start event (its start is bounded by entry prev's end, if any) */
    uint64_t b, c;
    uint64_t seq;  /* this entry's position in the queue (gt_tail when queued): tells a reused queue slot */
    uint64_t prev; /* seq + 1 of the entry on the same stream whose end bounds this one's start; 0: none */
    double seen;   /* when the reader saw its end complete (outcome GT_DONE) */
    int outcome;   /* once consumed: GT_DONE or GT_DROPPED */
    int found;     /* the last poll's finding: 0 nothing new, 1 start completed, 2 end completed, 3 a query failed */
    int started;   /* published started */
    int consumed;  /* resolved: its events are back in the pool (written by the reader with the GIL held; the hot
                      path reads it with an atomic load) */
} gt_entry;

/* Per stream that replayed (the last GT_STREAMS of them), seq + 1 of the last entry queued on it: the hot path's
 * test whether the previous timed replay on the stream is still unresolved. Producers only (the GIL). */
typedef struct {
    void *stream;
    uint64_t last;
} gt_stream_last;

static PyObject *gt_timer = NULL, *gt_caps = NULL, *gt_key_fn = NULL, *gt_key_arg = NULL;
static record_fn gt_record = NULL;
static query_fn gt_query = NULL;
static create_fn gt_create = NULL;
static capturing_fn gt_capturing = NULL;
static gt_entry *gt_q = NULL;
static uint64_t gt_qcap = 0, gt_head = 0, gt_tail = 0; /* head: the reader's; tail: the hot path's */
static uint64_t gt_limit = 0;
static void **gt_pool = NULL; /* free events */
static Py_ssize_t gt_npool = 0, gt_pool_cap = 0, gt_created = 0;
static pthread_mutex_t gt_pool_mu = PTHREAD_MUTEX_INITIALIZER; /* the pool: hot path pops, reader pushes */
static pthread_mutex_t gt_poll_mu = PTHREAD_MUTEX_INITIALIZER; /* one reader at a time (thread or a test) */
static uint64_t gt_recorded = 0, gt_errors = 0, gt_start_events = 0, gt_start_shared = 0;
static int gt_always = 0; /* 1: a start event before every replay (SGLSEAT_PROBE_GRAPH_START_EVENTS=always) */
static gt_stream_last gt_lasts[GT_STREAMS];
static int gt_nlasts = 0, gt_lasts_next = 0;
static PyObject *str_timer = NULL, *str_decided = NULL, *str_size = NULL, *str_runner = NULL,
                *str_ragged = NULL, *str_width = NULL, *str_before = NULL, *str_after = NULL;

static void *gt_pop(void) {
    void *ev = NULL;
    pthread_mutex_lock(&gt_pool_mu);
    if (gt_npool > 0) ev = gt_pool[--gt_npool];
    pthread_mutex_unlock(&gt_pool_mu);
    if (ev == NULL && gt_create != NULL && gt_created < gt_pool_cap) {
        /* a cold or drained pool: one more event (the pool has room for every event ever made) */
        if (gt_create(&ev, 2 /* cudaEventDisableTiming */) != 0 || ev == NULL) {
            PyErr_Clear(); /* a test's callback that raised */
            return NULL;
        }
        gt_created++;
    }
    return ev;
}

static void gt_push(void **evs, Py_ssize_t n) {
    pthread_mutex_lock(&gt_pool_mu);
    for (Py_ssize_t i = 0; i < n && gt_npool < gt_pool_cap; i++) gt_pool[gt_npool++] = evs[i];
    pthread_mutex_unlock(&gt_pool_mu);
}

/* seq + 1 of the last entry queued on this stream where the reader has not consumed it yet; 0: none (none queued,
 * already seen done or dropped, or a stream not in the table). */
static uint64_t gt_unresolved_last(void *stream) {
    for (int k = 0; k < gt_nlasts; k++) {
        if (gt_lasts[k].stream != stream) continue;
        uint64_t last = gt_lasts[k].last;
        if (last == 0) return 0;
        gt_entry *e = &gt_q[(last - 1) & (gt_qcap - 1)];
        if (e->seq != last - 1 || __atomic_load_n(&e->consumed, __ATOMIC_ACQUIRE)) return 0;
        return last;
    }
    return 0;
}

/* The stream's last queued entry is now seq + 1 = last. */
static void gt_set_last(void *stream, uint64_t last) {
    for (int k = 0; k < gt_nlasts; k++) {
        if (gt_lasts[k].stream == stream) {
            gt_lasts[k].last = last;
            return;
        }
    }
    int k = gt_nlasts < GT_STREAMS ? gt_nlasts++ : gt_lasts_next++ % GT_STREAMS; /* the oldest row goes */
    gt_lasts[k].stream = stream;
    gt_lasts[k].last = last;
}

/* Before a replay: 1 where it is timed (*stream set), with either its start event recorded on the current stream
 * (*ev set, *prev 0) or none (*ev NULL) and *prev the seq + 1 of the stream's previous entry, still unresolved, whose
 * end bounds this replay's start; 0: untimed. */
static int gt_before(void **stream_out, void **ev_out, uint64_t *prev_out) {
    if (gt_timer == NULL || gt_record == NULL) return 0;
    if (__atomic_load_n(&gt_tail, __ATOMIC_RELAXED) - __atomic_load_n(&gt_head, __ATOMIC_ACQUIRE) >= gt_limit)
        return 0; /* too many unresolved replays (a stalled stream): untimed, as ReplayTimer.before */
    if (PyList_Check(gt_caps) && PyList_GET_SIZE(gt_caps) > 0) {
        long ncap = PyLong_AsLong(PyList_GET_ITEM(gt_caps, 0));
        if (ncap != 0) {
            PyErr_Clear();
            return 0; /* a graph is being captured: an event recorded now would belong to it */
        }
    }
    PyObject *arg = PyCallable_Check(gt_key_arg) ? PyObject_CallNoArgs(gt_key_arg) : Py_NewRef(gt_key_arg);
    PyObject *key = arg == NULL ? NULL : PyObject_CallOneArg(gt_key_fn, arg);
    Py_XDECREF(arg);
    void *stream = key == NULL ? NULL : PyLong_AsVoidPtr(key);
    Py_XDECREF(key);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        gt_errors++;
        return 0;
    }
    if (gt_capturing != NULL) {
        int status = 0;
        int rc = gt_capturing(stream, &status);
        if (PyErr_Occurred()) PyErr_Clear();
        if (rc != 0 || status != 0) return 0; /* capturing (or cannot tell: the legacy stream beside a capture) */
    }
    uint64_t prev = gt_always ? 0 : gt_unresolved_last(stream);
    if (prev != 0) { /* the host runs ahead of the GPU here: the end event alone (see the section's comment) */
        gt_start_shared++;
        *stream_out = stream;
        *ev_out = NULL;
        *prev_out = prev;
        return 1;
    }
    void *ev = gt_pop();
    if (ev == NULL) {
        gt_errors++;
        return 0;
    }
    int rc = gt_record(ev, stream);
    if (rc != 0 || PyErr_Occurred()) {
        PyErr_Clear();
        gt_errors++;
        gt_push(&ev, 1);
        return 0;
    }
    gt_start_events++;
    *stream_out = stream;
    *ev_out = ev;
    *prev_out = 0;
    return 1;
}

/* After the replay in slot word b (call c): its end event recorded and the entry queued for the reader (ev0 its
 * start event, or NULL with prev as gt_before gave it); 0 where the end cannot be recorded (the caller marks the slot
 * untimed; a start event goes back to the pool). The previous entry named by prev may have been consumed meanwhile
 * (the replay released the GIL): the reader then finds its outcome in its queue slot, or treats this one as having no
 * start knowledge where that slot was reused. */
static int gt_after(void *stream, void *ev0, uint64_t prev, uint64_t b, uint64_t c) {
    void *ev1 = gt_timer == NULL ? NULL : gt_pop();
    int rc = ev1 == NULL ? -1 : gt_record(ev1, stream);
    if (rc != 0 || PyErr_Occurred()) {
        PyErr_Clear();
        gt_errors++;
        if (ev0 != NULL) gt_push(&ev0, 1);
        if (ev1 != NULL) gt_push(&ev1, 1);
        return 0;
    }
    uint64_t t = gt_tail; /* one producer at a time: the GIL */
    gt_entry *e = &gt_q[t & (gt_qcap - 1)];
    e->stream = stream;
    e->ev0 = ev0;
    e->ev1 = ev1;
    e->b = b;
    e->c = c;
    e->seq = t;
    e->prev = ev0 == NULL && prev <= t ? prev : 0;
    e->seen = 0.0;
    e->outcome = 0;
    e->found = 0;
    e->started = 0;
    __atomic_store_n(&e->consumed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&gt_tail, t + 1, __ATOMIC_RELEASE);
    gt_set_last(stream, t + 1);
    gt_recorded++;
    return 1;
}

/* The reader's lock, taken by a GIL holder (setup, clear): with the GIL released while waiting, since the reader
 * holds this lock when it takes the GIL back to publish. */
static void gt_lock_poll(void) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&gt_poll_mu);
    Py_END_ALLOW_THREADS
}

static void gt_forget(void) {
    Py_CLEAR(gt_timer);
    Py_CLEAR(gt_caps);
    Py_CLEAR(gt_key_fn);
    Py_CLEAR(gt_key_arg);
    gt_record = NULL;
    gt_query = NULL;
    gt_create = NULL;
    gt_capturing = NULL;
    gt_nlasts = gt_lasts_next = 0; /* a new setup's queue starts empty */
    /* the queue and pool are kept (a reader may still be in graph_poll); a new setup replaces them */
}

static PyObject *graph_setup(PyObject *mod, PyObject *args) {
    PyObject *timer, *caps, *key_fn, *key_arg;
    unsigned long long rec, qry, cre, cap;
    long long limit, prefill;
    int always;
    if (!PyArg_ParseTuple(args, "OO!OOKKKKLLp", &timer, &PyList_Type, &caps, &key_fn, &key_arg, &rec, &qry, &cre,
                          &cap, &limit, &prefill, &always))
        return NULL;
    if (!PyCallable_Check(key_fn) || rec == 0 || qry == 0 || limit < 1) {
        PyErr_SetString(PyExc_ValueError, "graph_setup needs a key_fn, record and query addresses, a limit");
        return NULL;
    }
    gt_lock_poll(); /* no reader inside the old queue while it is replaced */
    gt_forget();
    uint64_t qcap = 1;
    while (qcap < (uint64_t)limit) qcap <<= 1;
    gt_entry *q = PyMem_RawCalloc((size_t)qcap, sizeof(gt_entry));
    void **pool = PyMem_RawMalloc((size_t)(2 * qcap + 8) * sizeof(void *));
    if (q == NULL || pool == NULL) {
        PyMem_RawFree(q);
        PyMem_RawFree(pool);
        pthread_mutex_unlock(&gt_poll_mu);
        return PyErr_NoMemory();
    }
    PyMem_RawFree(gt_q);
    pthread_mutex_lock(&gt_pool_mu);
    PyMem_RawFree(gt_pool); /* (the old events are not destroyed: a replay queued on them may still be running) */
    gt_pool = pool;
    gt_pool_cap = (Py_ssize_t)(2 * qcap + 8);
    gt_npool = 0;
    gt_created = 0;
    pthread_mutex_unlock(&gt_pool_mu);
    gt_q = q;
    gt_qcap = qcap;
    gt_head = gt_tail = 0;
    gt_limit = (uint64_t)limit;
    gt_recorded = gt_errors = gt_start_events = gt_start_shared = 0;
    gt_always = always;
    gt_record = (record_fn)(uintptr_t)rec;
    gt_query = (query_fn)(uintptr_t)qry;
    gt_create = cre ? (create_fn)(uintptr_t)cre : NULL;
    gt_capturing = cap ? (capturing_fn)(uintptr_t)cap : NULL;
    gt_caps = Py_NewRef(caps);
    gt_key_fn = Py_NewRef(key_fn);
    gt_key_arg = Py_NewRef(key_arg);
    gt_timer = Py_NewRef(timer);
    pthread_mutex_unlock(&gt_poll_mu);
    /* the pool made now, off the hot path (a cold pool makes the replay create its events) */
    Py_ssize_t n = 0;
    for (; n < prefill && n < gt_pool_cap; n++) {
        void *ev = NULL;
        if (gt_create == NULL || gt_create(&ev, 2) != 0 || ev == NULL) break;
        gt_created++;
        gt_push(&ev, 1);
    }
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(n);
}

static PyObject *graph_clear(PyObject *mod, PyObject *timer) {
    if (timer == Py_None) { /* a forked child: the parent's reader held these, and does not exist here */
        pthread_mutex_init(&gt_pool_mu, NULL);
        pthread_mutex_init(&gt_poll_mu, NULL);
        gt_forget();
        gt_head = gt_tail = 0;
        Py_RETURN_NONE;
    }
    if (timer == gt_timer) {
        gt_lock_poll();
        gt_forget();
        pthread_mutex_unlock(&gt_poll_mu);
    }
    Py_RETURN_NONE;
}

/* ReplayTimer._publish: the slot's GPU times and state, where the slot still holds call c. */
static void gt_publish(uint64_t b, uint64_t c, int state, double start, double end, int has_end) {
    int64_t *w = ring_words;
    if (w == NULL || (uint64_t)w[b + 1] != c) return;
    double *d = (double *)w;
    uint64_t g = (ring_header_slots + ring_mask + 1) * 8 + 2 * ((b >> 3) - ring_header_slots);
    if ((g + 2) * 8 > ring_nbytes) return; /* a ring without its side area (a test's buffer) */
    double host = (double)w[b + 2] / 1e9;
    if (w[b + W_GPU] != GT_STARTED) d[g] = host > start ? host : start;
    if (has_end) d[g + 1] = end > d[g] ? end : d[g];
    w[b + W_GPU] = state;
}

/* The previous entry of e's stream (e->prev) where the reader has seen it done, still in its queue slot; NULL: not
 * (yet) known. */
static const gt_entry *gt_prev_done(const gt_entry *e) {
    if (e->prev == 0) return NULL;
    const gt_entry *p = &gt_q[(e->prev - 1) & (gt_qcap - 1)];
    if (p->seq != e->prev - 1 || !p->consumed || p->outcome != GT_DONE) return NULL;
    return p;
}

/* The previous entry of e's stream can no longer give e a start: it was dropped, or its queue slot was reused. */
static int gt_prev_gone(const gt_entry *e) {
    const gt_entry *p = &gt_q[(e->prev - 1) & (gt_qcap - 1)];
    return p->seq != e->prev - 1 || (p->consumed && p->outcome == GT_DROPPED);
}

static PyObject *graph_poll(PyObject *mod, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    uint64_t h, t, left = 0;
    int errors = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&gt_poll_mu);
    h = gt_head;
    t = __atomic_load_n(&gt_tail, __ATOMIC_ACQUIRE);
    query_fn query = gt_query;
    void *blocked[GT_MAX_BLOCKED];
    void *failed[GT_MAX_BLOCKED];
    int nblocked = 0, nfailed = 0;
    for (uint64_t i = h; i < t && query != NULL; i++) {
        gt_entry *e = &gt_q[i & (gt_qcap - 1)];
        if (e->consumed) continue;
        int skip = 0;
        for (int k = 0; k < nfailed && !skip; k++) skip = failed[k] == e->stream;
        if (skip) { /* a query on this stream failed: drop its replays (untimed), never raise */
            e->found = 3;
            continue;
        }
        for (int k = 0; k < nblocked && !skip; k++) skip = blocked[k] == e->stream;
        if (skip) continue; /* queued behind an unfinished replay of its stream */
        int r1 = query(e->ev1);
        if (r1 == 0) {
            e->found = 2;
            continue;
        }
        if (r1 == 600 /* cudaErrorNotReady */) {
            if (!e->started && e->ev0 != NULL && query(e->ev0) == 0) e->found = 1; /* (no start event: below) */
            if (nblocked < GT_MAX_BLOCKED) blocked[nblocked++] = e->stream;
            else break; /* more streams than tracked: the rest waits for the next poll */
            continue;
        }
        errors++;
        e->found = 3;
        if (nfailed < GT_MAX_BLOCKED) failed[nfailed++] = e->stream;
    }
    Py_END_ALLOW_THREADS
    /* published with the GIL: the hot path's slot writes and the ring's replacement happen under it */
    if (PyErr_Occurred()) PyErr_Clear(); /* a test's query callback that raised */
    void *freed[64];
    int nfreed = 0;
    void *pending[GT_MAX_BLOCKED]; /* streams with an unresolved entry earlier in the queue than the one at hand */
    int npending = 0, overflow = 0;
    for (uint64_t i = h; i < t; i++) {
        gt_entry *e = &gt_q[i & (gt_qcap - 1)];
        if (e->consumed) continue;
        if (e->found == 2 || e->found == 3) {
            if (e->found == 2) {
                double start = now;
                const gt_entry *p = e->started || e->ev0 != NULL ? NULL : gt_prev_done(e);
                if (p != NULL) start = p->seen;
                gt_publish(e->b, e->c, GT_DONE, start, now, 1);
                e->seen = now;
                e->outcome = GT_DONE;
            } else {
                if (ring_words != NULL && (uint64_t)ring_words[e->b + 1] == e->c) ring_words[e->b + W_GPU] = GPU_NONE;
                e->outcome = GT_DROPPED;
            }
            __atomic_store_n(&e->consumed, 1, __ATOMIC_RELEASE);
            if (e->ev0 != NULL) freed[nfreed++] = e->ev0; /* only events: a shared start has none */
            freed[nfreed++] = e->ev1;
            if (nfreed >= 62) {
                gt_push(freed, nfreed);
                nfreed = 0;
            }
            e->found = 0;
            continue;
        }
        int behind = overflow;
        for (int k = 0; k < npending && !behind; k++) behind = pending[k] == e->stream;
        if (e->found == 1) {
            if (ring_words != NULL && (uint64_t)ring_words[e->b + 1] == e->c && ring_words[e->b + W_GPU] == GT_QUEUED)
                gt_publish(e->b, e->c, GT_STARTED, now, 0.0, 0);
            e->started = 1;
        } else if (!e->started && e->ev0 == NULL && e->prev != 0 && !behind) {
            /* no start event: started once the previous entry of its stream was seen done (this poll or before),
             * from when it was; where that entry was dropped, no start is known (queued until its own end) */
            const gt_entry *p = gt_prev_done(e);
            if (p != NULL) {
                if (ring_words != NULL && (uint64_t)ring_words[e->b + 1] == e->c &&
                    ring_words[e->b + W_GPU] == GT_QUEUED)
                    gt_publish(e->b, e->c, GT_STARTED, p->seen, 0.0, 0);
                e->started = 1;
            } else if (gt_prev_gone(e)) {
                e->prev = 0;
            }
        }
        e->found = 0;
        if (!behind) {
            if (npending < GT_MAX_BLOCKED) pending[npending++] = e->stream;
            else overflow = 1; /* more streams than tracked: no start from a bound for the rest of this poll */
        }
    }
    if (nfreed) gt_push(freed, nfreed);
    while (h < t && gt_q[h & (gt_qcap - 1)].consumed) h++;
    for (uint64_t i = h; i < t; i++) left += !gt_q[i & (gt_qcap - 1)].consumed;
    __atomic_store_n(&gt_head, h, __ATOMIC_RELEASE);
    gt_errors += (uint64_t)errors;
    pthread_mutex_unlock(&gt_poll_mu);
    return PyLong_FromUnsignedLongLong(left);
}

static PyObject *graph_stats(PyObject *mod, PyObject *unused) {
    uint64_t queued = __atomic_load_n(&gt_tail, __ATOMIC_ACQUIRE) - __atomic_load_n(&gt_head, __ATOMIC_ACQUIRE);
    return Py_BuildValue("{sKsKsKsnsnsKsKsi}", "recorded", (unsigned long long)gt_recorded, "errors",
                         (unsigned long long)gt_errors, "queued", (unsigned long long)queued, "pool", gt_npool,
                         "created", gt_created, "start_events", (unsigned long long)gt_start_events,
                         "start_shared", (unsigned long long)gt_start_shared, "always", gt_always);
}

/* For a Python wrapper with the native timer (the fallback wrapper beside a C timer: the bench's Python arm). */
static PyObject *graph_before(PyObject *mod, PyObject *unused) {
    void *stream = NULL, *ev = NULL;
    uint64_t prev = 0;
    if (!gt_before(&stream, &ev, &prev)) Py_RETURN_NONE;
    return Py_BuildValue("(NNK)", PyLong_FromVoidPtr(stream), PyLong_FromVoidPtr(ev), (unsigned long long)prev);
}

static PyObject *graph_after(PyObject *mod, PyObject *args) {
    PyObject *ps, *pe;
    unsigned long long prev, b, c;
    if (!PyArg_ParseTuple(args, "OOKKK", &ps, &pe, &prev, &b, &c)) return NULL;
    void *stream = PyLong_AsVoidPtr(ps), *ev = PyLong_AsVoidPtr(pe);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(gt_after(stream, ev, (uint64_t)prev, b, c));
}

typedef struct {
    ProbeWrapper base; /* kw: the shape key's parameter name; globals: graph.py's module dict */
    PyObject *decide;  /* graph._decide */
    PyObject *owner;   /* a weak reference to the last owner (a backend) whose runner width is cached */
    int64_t width;
} GraphWrapper;

static int64_t gw_int(PyObject *v) { /* an int that is not a bool, else -1 */
    if (v == NULL || !PyLong_Check(v) || PyBool_Check(v)) return -1;
    int64_t r = PyLong_AsLongLong(v);
    if (r == -1 && PyErr_Occurred()) PyErr_Clear();
    return r;
}

/* graph.replay_shape: (token count, shape key); *key -1 where the key has no integer size (gs then -1 too). */
static int64_t gw_shape(GraphWrapper *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int64_t *key) {
    *key = -1;
    PyObject *obj = pw_arg(&w->base, args, nargs, kwnames);
    if (obj == NULL) return -1;
    int64_t size;
    if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        size = gw_int(obj);
    } else {
        PyObject *s = PyObject_GetAttr(obj, str_size);
        if (s == NULL) {
            PyErr_Clear();
            return -1;
        }
        size = PyLong_Check(s) && !PyBool_Check(s) ? PyLong_AsLongLong(s) : INT64_MIN;
        Py_DECREF(s);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        if (size == INT64_MIN) return -1;
    }
    *key = size;
    PyObject *owner = nargs > 0 ? args[0] : Py_None;
    /* The owner is held by a weak reference: a strong one kept the last backend (and the CUDA graphs it holds) alive
     * until this module's teardown, past torch's own. */
    PyObject *cached = w->owner == NULL ? NULL : PyWeakref_GetObject(w->owner); /* borrowed; Py_None once dead */
    if (owner != cached) { /* the runner's width, read once per owner */
        int64_t width = 1;
        PyObject *runner = PyObject_GetAttr(owner, str_runner);
        if (runner == NULL) PyErr_Clear();
        if (runner != NULL && runner != Py_None) {
            PyObject *rag = PyObject_GetAttr(runner, str_ragged);
            int ragged = rag == NULL ? 0 : PyObject_IsTrue(rag);
            Py_XDECREF(rag);
            if (ragged < 0 || rag == NULL) {
                PyErr_Clear();
                ragged = 0;
            }
            if (!ragged) {
                PyObject *wv = PyObject_GetAttr(runner, str_width);
                if (wv == NULL) PyErr_Clear();
                int64_t v = gw_int(wv);
                Py_XDECREF(wv);
                width = v > 0 ? v : 1;
            }
        }
        Py_XDECREF(runner);
        PyObject *ref = PyWeakref_NewRef(owner, NULL);
        if (ref == NULL) { /* an owner without weak references: its width is read again on each call */
            PyErr_Clear();
            Py_CLEAR(w->owner);
            return size * width;
        }
        Py_XSETREF(w->owner, ref);
        w->width = width;
    }
    return size * w->width;
}

static PyObject *graph_wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    GraphWrapper *w = (GraphWrapper *)self;
    if (!pw_ring(&w->base)) return PyObject_Vectorcall(w->base.fn, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* graph._TIMER once graph._DECIDED, else graph._decide() (the first replay decides) */
    PyObject *timer = NULL;
    PyObject *decided = PyDict_GetItemWithError(w->base.globals, str_decided);
    if (decided == Py_True) {
        timer = PyDict_GetItemWithError(w->base.globals, str_timer);
        Py_XINCREF(timer);
    } else if (!PyErr_Occurred()) {
        timer = PyObject_CallNoArgs(w->decide);
    }
    if (timer == NULL) PyErr_Clear();
    if (timer == Py_None) Py_CLEAR(timer);
    int64_t key;
    int64_t gs = gw_shape(w, args, nargs, kwnames, &key);
    int tidx = w->base.tidx;
    int64_t tword = key < 0 ? tidx
                            : (int64_t)((uint64_t)tidx | (1ULL << 16) |
                                        ((uint64_t)(key > 0x7FFFFFFF ? 0x7FFFFFFF : key) << 32));
    if (key < 0) gs = -1;
    pw_call k = pw_take();
    uint64_t b = k.b, c = k.c;
    void *stream = NULL, *ev0 = NULL;
    uint64_t prev = 0;
    PyObject *started = NULL; /* a Python timer's before() */
    int native = 0;
    if (timer != NULL) {
        if (timer == gt_timer) {
            native = gt_before(&stream, &ev0, &prev);
        } else {
            started = PyObject_CallMethodNoArgs(timer, str_before);
            if (started == NULL) PyErr_Clear();
            if (started == Py_None) Py_CLEAR(started);
        }
    }
    pw_open(&k, gs, tword, native || started != NULL ? GPU_QUEUED : GPU_NONE);
    PyObject *res = PyObject_Vectorcall(w->base.fn, args, nargsf, kwnames);
    if (native || started != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int ok = 0;
        if (native) {
            ok = gt_after(stream, ev0, prev, b, c);
        } else {
            PyObject *r = pw_call_timer(timer, str_after, started, b, c);
            ok = r != NULL && PyObject_IsTrue(r) == 1;
            Py_XDECREF(r);
            PyErr_Clear();
        }
        if (!ok) pw_untimed(&k);
        PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(started);
    Py_XDECREF(timer);
    pw_close(&k);
    return res;
}

static PyObject *graph_wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fn, *kw, *globals, *ensure, *decide;
    Py_ssize_t pos;
    int tidx;
    static char *names[] = {"fn", "tidx", "pos", "kw", "graph_globals", "ensure_ring", "decide", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OinUO!OO", names, &fn, &tidx, &pos, &kw, &PyDict_Type, &globals,
                                     &ensure, &decide))
        return NULL;
    if (!PyCallable_Check(fn) || !PyCallable_Check(ensure) || !PyCallable_Check(decide) || pos < 0) {
        PyErr_SetString(PyExc_TypeError, "fn, ensure_ring and decide must be callable, pos >= 0");
        return NULL;
    }
    GraphWrapper *w = (GraphWrapper *)pw_new(type, graph_wrapper_vectorcall, fn, kw, globals, ensure, pos, tidx);
    if (w == NULL) return NULL;
    w->decide = Py_NewRef(decide);
    w->owner = NULL;
    w->width = 1;
    return (PyObject *)w;
}

static int graph_wrapper_traverse(GraphWrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->decide);
    Py_VISIT(w->owner);
    return pw_traverse(&w->base, visit, arg);
}

static int graph_wrapper_clear(GraphWrapper *w) {
    Py_CLEAR(w->decide);
    Py_CLEAR(w->owner);
    return pw_clear(&w->base);
}

static PyTypeObject GraphWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe_native.GraphWrapper",
    .tp_basicsize = sizeof(GraphWrapper),
    .tp_doc = "A callable that times each CUDA graph replay into the probe ring (see the module source).",
    .tp_new = graph_wrapper_new,
    .tp_traverse = (traverseproc)graph_wrapper_traverse,
    .tp_clear = (inquiry)graph_wrapper_clear,
};

static PyMethodDef module_methods[] = {
    {"set_ring", set_ring, METH_VARARGS, "set_ring(buffer, mask, shift, header_slots): the ring to write"},
    {"clear_ring", clear_ring, METH_NOARGS, "forget the ring"},
    {"next_call", next_call, METH_NOARGS, "the next call number"},
    {"gpu_setup", gpu_setup, METH_VARARGS,
     "gpu_setup(timer, captures, key_fn, key_arg, record_addr, exact_arg, window_ns, limit): take the timer's hot path"},
    {"gpu_clear", gpu_clear, METH_O, "gpu_clear(timer or None): forget the timer (None: whichever)"},
    {"gpu_drain", gpu_drain, METH_VARARGS,
     "gpu_drain(timer, streams): move the timer's pending calls into its streams' lists"},
    {"gpu_arm", gpu_arm, METH_VARARGS, "gpu_arm(key, perf_ns): the stream recorded an event then"},
    {"gpu_disarm", gpu_disarm, METH_O, "gpu_disarm(key): the stream has no unresolved event"},
    {"gpu_pending", gpu_pending, METH_NOARGS, "how many calls wait in the pending buffer"},
    {"gpu_set_queued", gpu_set_queued, METH_O, "gpu_set_queued(n): the timer's queued count, for its bound"},
    {"graph_setup", graph_setup, METH_VARARGS,
     "graph_setup(timer, captures, key_fn, key_arg, record, query, create, capturing, limit, prefill, always): the "
     "replay timer"},
    {"graph_clear", graph_clear, METH_O, "graph_clear(timer or None): forget the replay timer (None: a forked child)"},
    {"graph_poll", graph_poll, METH_O, "graph_poll(now): publish what completed; returns the replays unresolved"},
    {"graph_stats", graph_stats, METH_NOARGS, "the replay timer's counters"},
    {"graph_before", graph_before, METH_NOARGS,
     "graph_before(): (stream, start event or 0, previous entry or 0) before a replay, or None: untimed"},
    {"graph_after", graph_after, METH_VARARGS, "graph_after(stream, event, prev, b, c): the end event, the entry queued"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "probe_native", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_probe_native(void) {
    if (pw_type_ready(&WrapperType) < 0) return NULL;
    str_numel = PyUnicode_InternFromString("numel");
    str_shape = PyUnicode_InternFromString("shape");
    str_gpu = PyUnicode_InternFromString("_GPU");
    str_end = PyUnicode_InternFromString("end");
    str_streams = PyUnicode_InternFromString("_streams");
    str_groups = PyUnicode_InternFromString("groups");
    str_last = PyUnicode_InternFromString("last_rec_ns");
    str_queued = PyUnicode_InternFromString("_queued");
    str_open = PyUnicode_InternFromString("open");
    str_free = PyUnicode_InternFromString("_free");
    str_cuda_event = PyUnicode_InternFromString("cuda_event");
    str_append = PyUnicode_InternFromString("append");
    str_recorded = PyUnicode_InternFromString("recorded");
    if (!str_numel || !str_shape || !str_gpu || !str_end || !str_streams || !str_groups || !str_last ||
        !str_queued || !str_open || !str_free || !str_cuda_event || !str_append ||
        !str_recorded)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (pw_type_ready(&GraphWrapperType) < 0) return NULL;
    str_timer = PyUnicode_InternFromString("_TIMER");
    str_decided = PyUnicode_InternFromString("_DECIDED");
    str_size = PyUnicode_InternFromString("size");
    str_runner = PyUnicode_InternFromString("_cuda_graph_runner");
    str_ragged = PyUnicode_InternFromString("ragged_verify_mode");
    str_width = PyUnicode_InternFromString("captured_req_width");
    str_before = PyUnicode_InternFromString("before");
    str_after = PyUnicode_InternFromString("after");
    if (!str_timer || !str_decided || !str_size || !str_runner || !str_ragged || !str_width || !str_before ||
        !str_after) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&GraphWrapperType);
    if (PyModule_AddObject(m, "GraphWrapper", (PyObject *)&GraphWrapperType) < 0) {
        Py_DECREF(&GraphWrapperType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&WrapperType);
    if (PyModule_AddObject(m, "Wrapper", (PyObject *)&WrapperType) < 0) {
        Py_DECREF(&WrapperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
