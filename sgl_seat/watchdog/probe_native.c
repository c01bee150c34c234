/* The probe's hot path in C: the same ring writes as probe.py's Python wrapper, without the interpreter.
 *
 * Why: around a real row fetch (a gather of hundreds of KB that evicts the caches) the Python wrapper added
 * 1.3-3.0 us per call, most of it the interpreter's own objects (frames, globals, the struct packer) missed
 * in cache after the gather; the target is 1 us. This file does exactly what probe._exact_wrapper's body does,
 * in the same order and with the same ring layout (probe.py's module doc has the writer protocol), and nothing
 * more. probe.py builds it at first use with the interpreter's own compiler into a private cache directory and
 * falls back to the Python wrapper wherever that fails; it is never required.
 *
 * Module functions:
 *   set_ring(buffer, mask, shift, header_slots)  the ring to write (a writable buffer, held until cleared);
 *                                                resets the call counter (a new ring starts at call 1)
 *   clear_ring()                                 forget the ring (reset, or a forked child)
 *   next_call()                                  the process-wide call counter (probe._NEXT uses it too)
 *   Wrapper(fn, tidx, pos, kw, mode, probe_globals, ensure_ring)
 *       a callable that times each call of fn: mode 0 none, 1 len, 2 numel, 3 dim0 of argument pos (or keyword
 *       kw); probe_globals is probe.py's module dict (its _GPU, read each call, as the Python wrapper does)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define W_END 3
#define W_GPU 7
#define END_BITS 48
#define END_MASK ((((uint64_t)1) << END_BITS) - 1)
#define LAP_MASK 0x7FFF
#define GPU_NONE 0
#define GPU_QUEUED 1

static Py_buffer ring_view;
static int64_t *ring_words = NULL; /* NULL: no ring (the wrapper asks probe._ensure_ring) */
static uint64_t ring_mask = 0;
static int ring_shift = 0;
static uint64_t ring_header_slots = 0;
static uint64_t counter = 0;

static PyTypeObject *numel_type = NULL; /* the type numel_descr belongs to (the last sized argument's) */
static PyObject *numel_descr = NULL;
static PyObject *str_numel = NULL, *str_shape = NULL, *str_gpu = NULL, *str_end = NULL;
static PyObject *str_fast = NULL, *str_streams = NULL, *str_groups = NULL, *str_last = NULL, *str_coalesce = NULL,
                *str_queued = NULL, *str_limit = NULL, *str_open = NULL, *str_free = NULL, *str_cuda_event = NULL,
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

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;
    PyObject *kw;      /* the sized argument's name, or None */
    PyObject *globals; /* probe.py's module dict */
    PyObject *ensure;  /* probe._ensure_ring */
    PyObject *dict;    /* functools.update_wrapper's attributes */
    Py_ssize_t pos;
    int tidx;
    int mode;
} Wrapper;

static int64_t gather_size(Wrapper *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *obj = NULL;
    if (w->mode == 0) return -1;
    if (w->pos >= 0 && w->pos < nargs) {
        obj = args[w->pos];
    } else if (kwnames != NULL && w->kw != Py_None) {
        Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            if (name == w->kw || PyUnicode_Compare(name, w->kw) == 0) {
                obj = args[nargs + i];
                break;
            }
        }
    }
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

static int64_t attr_int(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int64_t r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

typedef int (*record_fn)(void *event, void *stream); /* cudaEventRecord's signature */

/* GpuTimer.end without entering the interpreter, for the two common cases on a stream it already knows:
 *  - coalesce: a call less than the window after the stream's last event, while the stream has unresolved
 *    groups, joins the stream's open calls and records no event;
 *  - record: otherwise it takes a pooled event, records it on the stream through the CUDA runtime's
 *    cudaEventRecord (its address given by probe.py) and closes the stream's open calls into a new group.
 * Why here: on the H200 hosts measured (bench/gpu/writer_cost.py), the Python method behind these (the call, the
 * capture test, the stream lookup closure, the record closure) cost 1-2 us per coalesced call and several per
 * recorded one, against a budget of 2 us per call for GPU timing.
 * timer._fast is (captures, key_fn, key_arg, record_addr, exact_arg), set by probe.py where the capture hooks
 * are in place: the count of CUDA graph captures in progress (a list of one int), the stream key as
 * key_fn(key_arg) (key_arg called first where it is callable), the address of cudaEventRecord (0: GpuTimer.end
 * records), and exact_arg: where not None, a call that would record checks key_fn(exact_arg) (called first where
 * callable) against the key and leaves the call to GpuTimer.end where they differ. probe.py passes the process's
 * device as key_arg and -1 (the thread's current device) as exact_arg: asking the CUDA runtime for the current
 * device right after a large gather costs ~270 ns on an H200 host, so a coalesced call skips it and a record
 * (which decides the stream an event goes to) does not. The pool's events have a `cuda_event` attribute (the raw
 * handle; torch's Event) and the key is the raw stream handle.
 * Returns 1 where the call was queued here, 0 where GpuTimer.end decides (a new stream, an empty pool, a failed
 * record, a capture, a full queue), -1 on an error (the caller clears it and lets GpuTimer.end decide). The GIL
 * is held throughout and nothing here runs Python code but the key function (a builtin in CUDA), so the reader
 * thread sees each change whole, as it does in the Python method. */
static int fast_end(PyObject *g, uint64_t b, uint64_t c) {
    int res = 0;
    PyObject *fast = NULL, *arg = NULL, *key = NULL, *streams = NULL, *groups = NULL, *open = NULL, *item = NULL,
             *nq = NULL, *pool = NULL, *ev = NULL, *handle = NULL, *fresh = NULL, *group = NULL, *r = NULL,
             *stamp = NULL, *nrec = NULL, *xarg = NULL, *exact = NULL, *st = NULL;
    fast = PyObject_GetAttr(g, str_fast);
    if (fast == NULL) goto fail;
    if (!PyTuple_Check(fast) || PyTuple_GET_SIZE(fast) != 5) goto done;
    PyObject *caps = PyTuple_GET_ITEM(fast, 0);
    if (!PyList_Check(caps) || PyList_GET_SIZE(caps) < 1) goto done;
    long ncap = PyLong_AsLong(PyList_GET_ITEM(caps, 0));
    if (ncap == -1 && PyErr_Occurred()) goto fail;
    if (ncap > 0) goto done;
    int64_t queued = attr_int(g, str_queued);
    if (queued == -1 && PyErr_Occurred()) goto fail;
    int64_t limit = attr_int(g, str_limit);
    if (limit == -1 && PyErr_Occurred()) goto fail;
    if (queued >= limit) goto done;
    PyObject *karg = PyTuple_GET_ITEM(fast, 2);
    arg = PyCallable_Check(karg) ? PyObject_CallNoArgs(karg) : Py_NewRef(karg);
    if (arg == NULL) goto fail;
    key = PyObject_CallOneArg(PyTuple_GET_ITEM(fast, 1), arg);
    if (key == NULL) goto fail;
    streams = PyObject_GetAttr(g, str_streams);
    if (streams == NULL) goto fail;
    if (!PyDict_Check(streams)) goto done;
    st = PyDict_GetItemWithError(streams, key);
    if (st == NULL) {
        if (PyErr_Occurred()) goto fail;
        goto done; /* a new stream: GpuTimer.end makes its state and records its first event */
    }
    Py_INCREF(st); /* held: a key function or a test's record callback may run Python, and the reader drop it */
    PyObject *s = st;
    groups = PyObject_GetAttr(s, str_groups);
    if (groups == NULL) goto fail;
    Py_ssize_t ng = PyObject_Size(groups);
    if (ng < 0) goto fail;
    int64_t now = perf_ns();
    int coalesce = 0;
    if (ng > 0) {
        int64_t last = attr_int(s, str_last);
        if (last == -1 && PyErr_Occurred()) goto fail;
        int64_t window = attr_int(g, str_coalesce);
        if (window == -1 && PyErr_Occurred()) goto fail;
        coalesce = now - last < window;
    }
    open = PyObject_GetAttr(s, str_open);
    if (open == NULL) goto fail;
    if (!PyList_Check(open)) goto done;
    PyObject *pb = PyLong_FromUnsignedLongLong(b), *pc = PyLong_FromUnsignedLongLong(c);
    if (pb != NULL && pc != NULL) item = PyTuple_Pack(2, pb, pc);
    Py_XDECREF(pb);
    Py_XDECREF(pc);
    if (item == NULL) goto fail;
    if (!coalesce) {
        unsigned long long addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(fast, 3));
        if (addr == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        if (addr == 0) goto done;
        PyObject *xa = PyTuple_GET_ITEM(fast, 4);
        if (xa != Py_None) { /* the event's stream must be the thread's current one */
            xarg = PyCallable_Check(xa) ? PyObject_CallNoArgs(xa) : Py_NewRef(xa);
            if (xarg == NULL) goto fail;
            exact = PyObject_CallOneArg(PyTuple_GET_ITEM(fast, 1), xarg);
            if (exact == NULL) goto fail;
            int same = PyObject_RichCompareBool(exact, key, Py_EQ);
            if (same < 0) goto fail;
            if (!same) goto done;
        }
        pool = PyObject_GetAttr(g, str_free);
        if (pool == NULL) goto fail;
        if (!PyList_Check(pool) || PyList_GET_SIZE(pool) == 0) goto done; /* end() makes an event */
        Py_ssize_t np = PyList_GET_SIZE(pool);
        ev = Py_NewRef(PyList_GET_ITEM(pool, np - 1));
        handle = PyObject_GetAttr(ev, str_cuda_event);
        if (handle == NULL) goto fail;
        void *h = PyLong_AsVoidPtr(handle);
        if (h == NULL && PyErr_Occurred()) goto fail;
        void *stream = PyLong_AsVoidPtr(key);
        if (stream == NULL && PyErr_Occurred()) goto fail;
        if (((record_fn)(uintptr_t)addr)(h, stream) != 0) goto done; /* end() records again, and counts the error */
        if (PyErr_Occurred()) goto fail; /* a test's ctypes callback that raised */
        if (PyList_SetSlice(pool, np - 1, np, NULL) < 0) goto fail; /* the event leaves the pool once recorded */
        fresh = PyList_New(0);
        if (fresh == NULL || PyList_Append(open, item) < 0) goto fail;
        group = PyTuple_Pack(2, ev, open);
        if (group == NULL) goto fail;
        /* the stream's open calls become the new group, and a fresh list takes their place */
        if (PyObject_SetAttr(s, str_open, fresh) < 0) goto fail;
        r = PyObject_CallMethodOneArg(groups, str_append, group);
        if (r == NULL) goto fail;
        stamp = PyLong_FromLongLong(now);
        int64_t recorded = attr_int(g, str_recorded);
        if (recorded == -1 && PyErr_Occurred()) goto fail;
        nrec = PyLong_FromLongLong(recorded + 1);
        if (stamp == NULL || nrec == NULL || PyObject_SetAttr(s, str_last, stamp) < 0 ||
            PyObject_SetAttr(g, str_recorded, nrec) < 0)
            goto fail;
    } else if (PyList_Append(open, item) < 0) {
        goto fail;
    }
    nq = PyLong_FromLongLong(queued + 1);
    if (nq == NULL || PyObject_SetAttr(g, str_queued, nq) < 0) goto fail;
    res = 1;
done:
    Py_XDECREF(fast);
    Py_XDECREF(arg);
    Py_XDECREF(key);
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
    Py_XDECREF(xarg);
    Py_XDECREF(exact);
    Py_XDECREF(st);
    return res;
fail:
    res = -1;
    goto done;
}

static PyObject *wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Wrapper *w = (Wrapper *)self;
    if (ring_words == NULL) {
        PyObject *ok = PyObject_CallNoArgs(w->ensure);
        int yes = ok != NULL && PyObject_IsTrue(ok) == 1;
        Py_XDECREF(ok);
        if (PyErr_Occurred()) PyErr_Clear();
        if (!yes || ring_words == NULL) return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int64_t gs = gather_size(w, args, nargs, kwnames);
    /* probe._GPU, read each call like the Python wrapper's LOAD_GLOBAL (the event timer starts and stops). */
    PyObject *g = PyDict_GetItemWithError(w->globals, str_gpu);
    if (g == NULL && PyErr_Occurred()) PyErr_Clear();
    if (g == Py_None) g = NULL;
    Py_XINCREF(g);
    int64_t *words = ring_words;
    uint64_t c = take_call();
    uint64_t b = ((c & ring_mask) + ring_header_slots) << 3; /* the slot's first word */
    int64_t *slot = words + b;
    uint64_t lap = ((c >> ring_shift) & LAP_MASK) << END_BITS;
    __atomic_store_n(&slot[0], (int64_t)(2 * c + 1), __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    slot[1] = (int64_t)c;
    slot[2] = now_ns();
    slot[W_END] = 0;
    slot[4] = gs;
    slot[5] = (int64_t)PyThread_get_thread_ident();
    slot[6] = w->tidx;
    slot[W_GPU] = g == NULL ? GPU_NONE : GPU_QUEUED;
    __atomic_store_n(&slot[0], (int64_t)(2 * c + 2), __ATOMIC_RELEASE);
    PyObject *res = PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    if (g != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int done = fast_end(g, b, c);
        if (done < 0) PyErr_Clear();
        if (done <= 0) {
            PyObject *r = NULL;
            PyObject *pb = PyLong_FromUnsignedLongLong(b), *pc = PyLong_FromUnsignedLongLong(c);
            if (pb != NULL && pc != NULL) {
                PyObject *argv[3] = {g, pb, pc};
                r = PyObject_VectorcallMethod(str_end, argv, 3, NULL);
            }
            Py_XDECREF(pb);
            Py_XDECREF(pc);
            if (r == NULL) {
                PyErr_Clear();
                if (ring_words == words) words[b + W_GPU] = GPU_NONE; /* untimed on the GPU, as end() does */
            }
            Py_XDECREF(r);
        }
        PyErr_Restore(et, ev, tb);
        Py_DECREF(g);
    }
    /* blind end store with the call's lap (probe.py's module doc); a ring replaced meanwhile is not written */
    if (ring_words == words)
        __atomic_store_n(&slot[W_END], (int64_t)(lap | ((uint64_t)now_ns() & END_MASK)), __ATOMIC_RELEASE);
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
    Wrapper *w = (Wrapper *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->vectorcall = wrapper_vectorcall;
    w->fn = Py_NewRef(fn);
    w->kw = Py_NewRef(kw);
    w->globals = Py_NewRef(globals);
    w->ensure = Py_NewRef(ensure);
    w->dict = NULL;
    w->pos = pos;
    w->tidx = tidx;
    w->mode = mode;
    return (PyObject *)w;
}

static int wrapper_traverse(Wrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->fn);
    Py_VISIT(w->kw);
    Py_VISIT(w->globals);
    Py_VISIT(w->ensure);
    Py_VISIT(w->dict);
    return 0;
}

static int wrapper_clear(Wrapper *w) {
    Py_CLEAR(w->fn);
    Py_CLEAR(w->kw);
    Py_CLEAR(w->globals);
    Py_CLEAR(w->ensure);
    Py_CLEAR(w->dict);
    return 0;
}

static void wrapper_dealloc(Wrapper *w) {
    PyObject_GC_UnTrack(w);
    wrapper_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* A method wrapped on its class is bound like the function it replaces. */
static PyObject *wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *wrapper_fn(Wrapper *w, void *closure) { return Py_NewRef(w->fn); }

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"probed_function", (getter)wrapper_fn, NULL, "the wrapped callable", NULL},
    {NULL},
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe_native.Wrapper",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A callable that times each call into the probe ring (see the module source).",
    .tp_new = wrapper_new,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_descr_get = wrapper_descr_get,
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_getset = wrapper_getset,
};

static PyMethodDef module_methods[] = {
    {"set_ring", set_ring, METH_VARARGS, "set_ring(buffer, mask, shift, header_slots): the ring to write"},
    {"clear_ring", clear_ring, METH_NOARGS, "forget the ring"},
    {"next_call", next_call, METH_NOARGS, "the next call number"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "probe_native", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_probe_native(void) {
    if (PyType_Ready(&WrapperType) < 0) return NULL;
    str_numel = PyUnicode_InternFromString("numel");
    str_shape = PyUnicode_InternFromString("shape");
    str_gpu = PyUnicode_InternFromString("_GPU");
    str_end = PyUnicode_InternFromString("end");
    str_fast = PyUnicode_InternFromString("_fast");
    str_streams = PyUnicode_InternFromString("_streams");
    str_groups = PyUnicode_InternFromString("groups");
    str_last = PyUnicode_InternFromString("last_rec_ns");
    str_coalesce = PyUnicode_InternFromString("_coalesce_ns");
    str_queued = PyUnicode_InternFromString("_queued");
    str_limit = PyUnicode_InternFromString("_limit");
    str_open = PyUnicode_InternFromString("open");
    str_free = PyUnicode_InternFromString("_free");
    str_cuda_event = PyUnicode_InternFromString("cuda_event");
    str_append = PyUnicode_InternFromString("append");
    str_recorded = PyUnicode_InternFromString("recorded");
    if (!str_numel || !str_shape || !str_gpu || !str_end || !str_fast || !str_streams || !str_groups || !str_last ||
        !str_coalesce || !str_queued || !str_limit || !str_open || !str_free || !str_cuda_event || !str_append ||
        !str_recorded)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&WrapperType);
    if (PyModule_AddObject(m, "Wrapper", (PyObject *)&WrapperType) < 0) {
        Py_DECREF(&WrapperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
