/*
 * pipeinfer._native: the two llama.cpp callbacks a pipeline stage needs, in C.
 *
 *  - eval callback (cb_eval): llama.cpp asks it about every graph node; it claims only the
 *    tensor named "l_out-<last layer of the slice>" and copies that tensor's rows into a caller
 *    buffer, appending (a batch larger than n_ubatch is computed as several graphs).
 *  - abort callback: polled about once per graph node; it aborts the decode when the run being
 *    decoded is the one a cancellation named.
 *
 * Doing this in C keeps hundreds of callbacks per decode off the Python interpreter. No
 * llama.cpp or ggml headers are needed: the three ggml functions used are passed in as
 * function pointers (looked up by Python in libggml-base), and a tensor is an opaque pointer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef const char *(*get_name_fn)(const void *tensor);
typedef size_t (*nbytes_fn)(const void *tensor);
typedef void (*tensor_get_fn)(const void *tensor, void *data, size_t offset, size_t size);

typedef struct {
    char target[64];          /* name of the tensor to capture, e.g. "l_out-9" */
    get_name_fn get_name;
    nbytes_fn nbytes;
    tensor_get_fn tensor_get;
    char *buf;                /* caller-owned destination */
    size_t cap;               /* its size in bytes */
    size_t used;              /* bytes captured since the last reset */
    bool overflow;            /* a capture did not fit */
    atomic_llong active_run;  /* run id being decoded (-1: none) */
    atomic_llong abort_run;   /* run id a cancellation named (-1: none) */
    atomic_ullong polls;      /* abort-callback calls, for tests and diagnostics */
} stage_state;

static bool eval_callback(void *tensor, bool ask, void *user_data) {
    stage_state *s = (stage_state *)user_data;
    const char *name = s->get_name(tensor);
    bool match = name != NULL && strcmp(name, s->target) == 0;
    if (ask) {
        return match;
    }
    if (match) {
        size_t n = s->nbytes(tensor);
        if (s->buf != NULL && s->used + n <= s->cap) {
            s->tensor_get(tensor, s->buf + s->used, 0, n);
            s->used += n;
        } else {
            s->overflow = true;
        }
    }
    return true; /* keep computing */
}

static bool abort_callback(void *user_data) {
    stage_state *s = (stage_state *)user_data;
    atomic_fetch_add_explicit(&s->polls, 1, memory_order_relaxed);
    long long active = atomic_load_explicit(&s->active_run, memory_order_acquire);
    return active >= 0 && active == atomic_load_explicit(&s->abort_run, memory_order_acquire);
}

static stage_state *state_arg(unsigned long long addr) {
    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError, "null stage state");
    }
    return (stage_state *)(uintptr_t)addr;
}

static PyObject *py_state_new(PyObject *self, PyObject *args) {
    const char *target;
    unsigned long long get_name, nbytes, tensor_get;
    if (!PyArg_ParseTuple(args, "yKKK", &target, &get_name, &nbytes, &tensor_get)) {
        return NULL;
    }
    if (strlen(target) >= sizeof(((stage_state *)0)->target)) {
        PyErr_SetString(PyExc_ValueError, "tensor name too long");
        return NULL;
    }
    if (!get_name || !nbytes || !tensor_get) {
        PyErr_SetString(PyExc_ValueError, "ggml function pointers must not be null");
        return NULL;
    }
    stage_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return PyErr_NoMemory();
    }
    strcpy(s->target, target);
    s->get_name = (get_name_fn)(uintptr_t)get_name;
    s->nbytes = (nbytes_fn)(uintptr_t)nbytes;
    s->tensor_get = (tensor_get_fn)(uintptr_t)tensor_get;
    atomic_init(&s->active_run, -1);
    atomic_init(&s->abort_run, -1);
    atomic_init(&s->polls, 0);
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

static PyObject *py_state_free(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) {
        return NULL;
    }
    free((void *)(uintptr_t)addr);
    Py_RETURN_NONE;
}

/* Point captures at a new buffer and forget earlier captures. */
static PyObject *py_state_reset(PyObject *self, PyObject *args) {
    unsigned long long addr, buf, cap;
    if (!PyArg_ParseTuple(args, "KKK", &addr, &buf, &cap)) {
        return NULL;
    }
    stage_state *s = state_arg(addr);
    if (s == NULL) {
        return NULL;
    }
    s->buf = (char *)(uintptr_t)buf;
    s->cap = (size_t)cap;
    s->used = 0;
    s->overflow = false;
    Py_RETURN_NONE;
}

/* (bytes captured, overflowed) since the last reset. */
static PyObject *py_state_captured(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) {
        return NULL;
    }
    stage_state *s = state_arg(addr);
    if (s == NULL) {
        return NULL;
    }
    return Py_BuildValue("(KO)", (unsigned long long)s->used, s->overflow ? Py_True : Py_False);
}

static PyObject *py_set_active_run(PyObject *self, PyObject *args) {
    unsigned long long addr;
    long long run;
    if (!PyArg_ParseTuple(args, "KL", &addr, &run)) {
        return NULL;
    }
    stage_state *s = state_arg(addr);
    if (s == NULL) {
        return NULL;
    }
    atomic_store_explicit(&s->active_run, run, memory_order_release);
    Py_RETURN_NONE;
}

/* Safe to call from any thread while a decode is running. */
static PyObject *py_set_abort_run(PyObject *self, PyObject *args) {
    unsigned long long addr;
    long long run;
    if (!PyArg_ParseTuple(args, "KL", &addr, &run)) {
        return NULL;
    }
    stage_state *s = state_arg(addr);
    if (s == NULL) {
        return NULL;
    }
    atomic_store_explicit(&s->abort_run, run, memory_order_release);
    Py_RETURN_NONE;
}

static PyObject *py_polls(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) {
        return NULL;
    }
    stage_state *s = state_arg(addr);
    if (s == NULL) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(atomic_load(&s->polls));
}

static PyObject *py_callback_addresses(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)&eval_callback,
                         (unsigned long long)(uintptr_t)&abort_callback);
}

static PyMethodDef methods[] = {
    {"state_new", py_state_new, METH_VARARGS,
     "state_new(target_name, ggml_get_name, ggml_nbytes, ggml_backend_tensor_get) -> address"},
    {"state_free", py_state_free, METH_VARARGS, "state_free(address)"},
    {"state_reset", py_state_reset, METH_VARARGS, "state_reset(address, buffer, capacity)"},
    {"state_captured", py_state_captured, METH_VARARGS,
     "state_captured(address) -> (bytes, overflowed)"},
    {"set_active_run", py_set_active_run, METH_VARARGS, "set_active_run(address, run_id or -1)"},
    {"set_abort_run", py_set_abort_run, METH_VARARGS, "set_abort_run(address, run_id or -1)"},
    {"polls", py_polls, METH_VARARGS, "polls(address) -> abort-callback calls so far"},
    {"callback_addresses", py_callback_addresses, METH_NOARGS,
     "callback_addresses() -> (eval_callback, abort_callback)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeinfer._native",
    "llama.cpp eval and abort callbacks for pipeline stages", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
