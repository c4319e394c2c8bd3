/* The integer counters the event loop left for later, counted in one C loop over a capture batch
 * (kinspect.capture.count_later.LaterCounter.count_python is the reference: change both).
 *
 * Why C: the writer process counts them for every side the event loop did not (a frame scanned whole from
 * bytes, codegen.COUNT_LATER). In Python the loop around the scans, the lookups and the tuples rebuilt cost
 * about 1 us a side beside the scan itself, most of what moving the counting off the event loop added to the
 * writer process; on a 2-core machine that process's CPU is taken from the clients and the broker.
 *
 * count(facts, scans, scan_of, cache, cache_bytes, cache_max) -> list
 *   facts: list of EXCHANGE tuples (29 items, capture.facts.FIELDS); scans: dict (api key, version, is request)
 *   -> (the C scan_fresh or None, its zeroed counters, its integer slots, the CompiledStruct or None), which
 *   scan_of(api key, version, is request) fills; cache: dict, where bodies of at most cache_bytes are kept
 *   (cache_max of them, then it is cleared) with their scan's entry and counters, by a hash of both.
 *   Returns facts itself when no side holds a frame to count, else a new list: each such row rebuilt with
 *   its sides' (int_slots, int_stats) counted, ((), None) where the frame does not scan. A side several
 *   rows share (the same object, read at the same api and version) is counted once and stays shared. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

enum { F_API_KEY = 7, F_REQUEST_VERSION = 9, F_REQUEST_SIDE = 19, F_RESPONSE_VERSION = 21, F_RESPONSE_SIDE = 28,
       F_COUNT = 29, S_STATS = 4, S_COUNT = 8 };

static PyObject *s_int_slots, *s_int_stats, *s_scan_fresh, *uncounted; /* uncounted: ((), None) */

/* A 64-bit hash of a body, with its length: the cache's key (found, then compared whole). */
static uint64_t body_hash(const unsigned char *p, Py_ssize_t n, uintptr_t scan)
{
    uint64_t h = (0x9E3779B97F4A7C15ull ^ (uint64_t)n) + (uint64_t)scan * 0xC2B2AE3D27D4EB4Full;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

typedef struct { /* a side already counted in this call: the same object read the same way gives the same side */
    PyObject *side, *out;
    long api, version;
    int request;
} Seen;

typedef struct {
    Seen *slots;
    size_t mask;
} SeenTable;

static Seen *seen_slot(SeenTable *t, PyObject *side, long api, long version, int request)
{
    size_t i = (size_t)(((uintptr_t)side >> 4) * 0x9E3779B97F4A7C15ull >> 20) & t->mask;
    for (;; i = (i + 1) & t->mask) {
        Seen *s = &t->slots[i];
        if (s->side == NULL || (s->side == side && s->api == api && s->version == version && s->request == request))
            return s;
    }
}

/* (int_slots, int_stats) of a ScanResult: new reference; `uncounted` where it has no counters. */
static PyObject *counted_of(PyObject *result)
{
    PyObject *stats = PyObject_GetAttr(result, s_int_stats);
    if (stats == NULL)
        return NULL;
    if (stats == Py_None || !PyBytes_CheckExact(stats)) {
        Py_DECREF(stats);
        return Py_NewRef(uncounted);
    }
    PyObject *slots = PyObject_GetAttr(result, s_int_slots);
    PyObject *out = slots == NULL ? NULL : PyTuple_Pack(2, slots, stats);
    Py_XDECREF(slots);
    Py_DECREF(stats);
    return out;
}

/* The counters of one frame, (int_slots, int_stats): new reference, NULL on an error that is not the frame's. */
static PyObject *count_frame(PyObject *scan, PyObject *frame, PyObject *pos, PyObject *cache, Py_ssize_t cache_bytes,
                             Py_ssize_t cache_max)
{
    PyObject *fresh = PyTuple_GET_ITEM(scan, 0), *template = PyTuple_GET_ITEM(scan, 1);
    PyObject *slots = PyTuple_GET_ITEM(scan, 2), *compiled = PyTuple_GET_ITEM(scan, 3);
    if (fresh == Py_None && compiled == Py_None)
        return Py_NewRef(uncounted); /* a struct without integer fields, or an api the specs do not know */
    Py_ssize_t at = PyLong_AsSsize_t(pos), size = PyBytes_GET_SIZE(frame);
    if (at < 0 || at > size) {
        PyErr_Clear();
        return Py_NewRef(uncounted);
    }
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(frame) + at;
    PyObject *key = NULL;
    if (size - at <= cache_bytes) {
        key = PyLong_FromUnsignedLongLong(body_hash(body, size - at, (uintptr_t)scan));
        if (key == NULL)
            return NULL;
        PyObject *hit = PyDict_GetItemWithError(cache, key); /* (scan, body, counted) */
        if (hit != NULL && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 3 && PyTuple_GET_ITEM(hit, 0) == scan) {
            PyObject *kept = PyTuple_GET_ITEM(hit, 1);
            if (PyBytes_CheckExact(kept) && PyBytes_GET_SIZE(kept) == size - at
                && memcmp(PyBytes_AS_STRING(kept), body, size - at) == 0) {
                Py_DECREF(key);
                return Py_NewRef(PyTuple_GET_ITEM(hit, 2));
            }
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
    }
    PyObject *result;
    if (fresh != Py_None) {
        PyObject *args[4] = {frame, pos, template, slots};
        result = PyObject_Vectorcall(fresh, args, 4, NULL);
    } else {
        PyObject *args[4] = {compiled, frame, pos, Py_True};
        result = PyObject_VectorcallMethod(s_scan_fresh, args, 4, NULL);
    }
    PyObject *counted;
    if (result == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_XDECREF(key);
            return NULL;
        }
        PyErr_Clear(); /* it scanned well on the event loop: not expected, and the row is kept without counters */
        counted = Py_NewRef(uncounted);
    } else {
        counted = counted_of(result);
        Py_DECREF(result);
        if (counted == NULL) {
            Py_XDECREF(key);
            return NULL;
        }
    }
    if (key != NULL) {
        PyObject *kept = PyBytes_FromStringAndSize((const char *)body, size - at);
        PyObject *entry = kept == NULL ? NULL : PyTuple_Pack(3, scan, kept, counted); /* keeps scan alive */
        Py_XDECREF(kept);
        int failed = entry == NULL;
        if (!failed && PyDict_GET_SIZE(cache) >= cache_max)
            PyDict_Clear(cache); /* a client making up bodies does not grow it without bound */
        failed = failed || PyDict_SetItem(cache, key, entry) < 0;
        Py_XDECREF(entry);
        Py_DECREF(key);
        if (failed) {
            Py_DECREF(counted);
            return NULL;
        }
    }
    return counted;
}

/* The side counted: new reference (the side itself when it holds no frame to count), NULL on an error. */
static PyObject *counted_side(PyObject *side, PyObject *row, int request, PyObject *scans, PyObject *scan_of,
                              PyObject *cache, SeenTable *seen, Py_ssize_t cache_bytes, Py_ssize_t cache_max)
{
    if (!PyTuple_CheckExact(side) || PyTuple_GET_SIZE(side) != S_COUNT)
        return Py_NewRef(side);
    PyObject *later = PyTuple_GET_ITEM(side, S_STATS);
    if (!PyTuple_CheckExact(later) || PyTuple_GET_SIZE(later) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(later, 0))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(later, 1)))
        return Py_NewRef(side);
    PyObject *api = PyTuple_GET_ITEM(row, F_API_KEY), *version = PyTuple_GET_ITEM(row, request ? F_REQUEST_VERSION
                                                                                              : F_RESPONSE_VERSION);
    long api_n = PyLong_CheckExact(api) ? PyLong_AsLong(api) : -1, version_n = PyLong_CheckExact(version)
                                                                                 ? PyLong_AsLong(version) : -1;
    if (PyErr_Occurred())
        PyErr_Clear();
    Seen *s = seen_slot(seen, side, api_n, version_n, request);
    if (s->side != NULL && PyLong_CheckExact(api) && PyLong_CheckExact(version))
        return Py_NewRef(s->out);
    PyObject *key = PyTuple_Pack(3, api, version, request ? Py_True : Py_False);
    if (key == NULL)
        return NULL;
    PyObject *scan = PyDict_GetItemWithError(scans, key);
    if (scan != NULL)
        Py_INCREF(scan);
    else if (!PyErr_Occurred())
        scan = PyObject_CallFunctionObjArgs(scan_of, api, version, request ? Py_True : Py_False, NULL);
    Py_DECREF(key);
    if (scan == NULL)
        return NULL;
    if (!PyTuple_CheckExact(scan) || PyTuple_GET_SIZE(scan) != 4) {
        Py_DECREF(scan);
        PyErr_SetString(PyExc_TypeError, "count: a scan entry must be a 4-tuple");
        return NULL;
    }
    PyObject *counted = count_frame(scan, PyTuple_GET_ITEM(later, 0), PyTuple_GET_ITEM(later, 1), cache, cache_bytes,
                                    cache_max);
    Py_DECREF(scan);
    if (counted == NULL)
        return NULL;
    PyObject *out = PyTuple_New(S_COUNT);
    if (out == NULL) {
        Py_DECREF(counted);
        return NULL;
    }
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *v = i == 3 ? PyTuple_GET_ITEM(counted, 0) : i == 4 ? PyTuple_GET_ITEM(counted, 1)
                                                                     : PyTuple_GET_ITEM(side, i);
        PyTuple_SET_ITEM(out, i, Py_NewRef(v));
    }
    Py_DECREF(counted);
    if (PyLong_CheckExact(api) && PyLong_CheckExact(version)) { /* made-up facts (None) are not remembered */
        s->side = side;
        s->out = out; /* borrowed: the output list holds it for the whole call */
        s->api = api_n;
        s->version = version_n;
        s->request = request;
    }
    return out;
}

static PyObject *count(PyObject *module, PyObject *args)
{
    PyObject *facts, *scans, *scan_of, *cache;
    Py_ssize_t cache_bytes, cache_max;
    if (!PyArg_ParseTuple(args, "O!O!OO!nn:count", &PyList_Type, &facts, &PyDict_Type, &scans, &scan_of, &PyDict_Type,
                          &cache, &cache_bytes, &cache_max))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(facts);
    SeenTable seen = {NULL, 0};
    size_t cap = 16;
    while (cap < (size_t)n * 4 + 16)
        cap *= 2;
    PyObject *out = NULL, *held = PyList_GetSlice(facts, 0, n); /* the rows stay alive whatever scan_of does */
    if (held == NULL)
        return NULL;
    seen.slots = PyMem_Calloc(cap, sizeof(Seen));
    seen.mask = cap - 1;
    if (seen.slots == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(held, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != F_COUNT)
            continue; /* not an EXCHANGE: the builder says so */
        PyObject *req = PyTuple_GET_ITEM(row, F_REQUEST_SIDE), *resp = PyTuple_GET_ITEM(row, F_RESPONSE_SIDE);
        PyObject *new_req = counted_side(req, row, 1, scans, scan_of, cache, &seen, cache_bytes, cache_max);
        if (new_req == NULL)
            goto fail;
        PyObject *new_resp = counted_side(resp, row, 0, scans, scan_of, cache, &seen, cache_bytes, cache_max);
        if (new_resp == NULL) {
            Py_DECREF(new_req);
            goto fail;
        }
        if (new_req == req && new_resp == resp) {
            Py_DECREF(new_req);
            Py_DECREF(new_resp);
            continue;
        }
        if (out == NULL && (out = PyList_GetSlice(held, 0, n)) == NULL) {
            Py_DECREF(new_req);
            Py_DECREF(new_resp);
            goto fail;
        }
        PyObject *rebuilt = PyTuple_New(F_COUNT);
        if (rebuilt == NULL) {
            Py_DECREF(new_req);
            Py_DECREF(new_resp);
            goto fail;
        }
        for (int j = 0; j < F_COUNT; j++) {
            PyObject *item = j == F_REQUEST_SIDE    ? new_req
                             : j == F_RESPONSE_SIDE ? new_resp
                                                    : Py_NewRef(PyTuple_GET_ITEM(row, j));
            PyTuple_SET_ITEM(rebuilt, j, item);
        }
        PyList_SET_ITEM(out, i, rebuilt); /* steals; the slice's reference to the old row goes */
        Py_DECREF(row);
    }
    PyMem_Free(seen.slots);
    if (out == NULL) {
        Py_DECREF(held);
        return Py_NewRef(facts);
    }
    Py_DECREF(held);
    return out;
fail:
    PyMem_Free(seen.slots);
    Py_XDECREF(out);
    Py_DECREF(held);
    return NULL;
}

static PyMethodDef methods[] = {
    {"count", count, METH_VARARGS, "A capture batch, its integer counters left for later counted (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.capture._count_later",
    "The integer counters the event loop left for later, counted over a capture batch in one loop "
    "(capture.count_later.LaterCounter.count_python is the reference).",
    -1, methods};

PyMODINIT_FUNC PyInit__count_later(void)
{
    if ((s_int_slots = PyUnicode_InternFromString("int_slots")) == NULL
        || (s_int_stats = PyUnicode_InternFromString("int_stats")) == NULL
        || (s_scan_fresh = PyUnicode_InternFromString("scan_fresh")) == NULL)
        return NULL;
    PyObject *none_slots = PyTuple_New(0);
    if (none_slots == NULL || (uncounted = PyTuple_Pack(2, none_slots, Py_None)) == NULL) {
        Py_XDECREF(none_slots);
        return NULL;
    }
    Py_DECREF(none_slots);
    return PyModule_Create(&module_def);
}
