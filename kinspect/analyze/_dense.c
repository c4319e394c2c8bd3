/* Dense ids of int64 keys in the order they first appear: kinspect.analyze.groups.first_seen in C.
 *
 * The analyze job groups rows by one packed int64 key per row (kinspect/analyze/groups.py).
 * Arrow's dictionary_encode gives the same ids, but costs about 110 ns a row once a piece
 * holds a few hundred thousand distinct keys (the `values` merge); this open-addressing
 * table costs about a third of that. The Python path stays the reference, and
 * tests/analyze/test_dense.py checks both give the same ids and first rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int64_t key;
    int64_t id; /* -1: empty */
} Slot;

/* murmur3's 64-bit finalizer: packed keys are often runs of neighbours, which a plain
 * multiplication would still spread, but keys chosen to collide would not be */
static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static Slot *empty_table(size_t capacity) {
    Slot *table = malloc(capacity * sizeof(Slot));
    if (table != NULL) {
        for (size_t i = 0; i < capacity; i++) {
            table[i].id = -1;
        }
    }
    return table;
}

/* The table at twice the capacity, every key moved over; NULL (the old one freed) when out of memory. */
static Slot *grown(Slot *table, size_t capacity) {
    size_t larger = capacity * 2, mask = larger - 1;
    Slot *moved = empty_table(larger);
    if (moved != NULL) {
        for (size_t i = 0; i < capacity; i++) {
            if (table[i].id >= 0) {
                size_t at = mix((uint64_t)table[i].key) & mask;
                while (moved[at].id >= 0) {
                    at = (at + 1) & mask;
                }
                moved[at] = table[i];
            }
        }
    }
    free(table);
    return moved;
}

/* Fills ids[r] (each row's id) and first[i] (id i's first row); returns the number of ids, or -1
 * when out of memory. Runs without the GIL. */
static int64_t number_keys(const int64_t *keys, Py_ssize_t rows, int64_t *ids, int64_t *first) {
    size_t capacity = 1024, mask = capacity - 1;
    int64_t number = 0;
    Slot *table = empty_table(capacity);
    if (table == NULL) {
        return -1;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        int64_t key = keys[row];
        size_t at = mix((uint64_t)key) & mask;
        for (;;) {
            Slot *slot = &table[at];
            if (slot->id < 0) {
                slot->key = key;
                slot->id = number;
                first[number] = row;
                ids[row] = number++;
                if ((size_t)number * 2 > capacity) { /* at most half full: short probes */
                    table = grown(table, capacity);
                    if (table == NULL) {
                        return -1;
                    }
                    capacity *= 2;
                    mask = capacity - 1;
                }
                break;
            }
            if (slot->key == key) {
                ids[row] = slot->id;
                break;
            }
            at = (at + 1) & mask;
        }
    }
    free(table);
    return number;
}

static int writable_int64s(Py_buffer *view, Py_ssize_t rows, const char *name) {
    if (view->len < rows * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "first_seen: %s holds fewer than %zd int64s", name, rows);
        return 0;
    }
    return 1;
}

static PyObject *first_seen(PyObject *module, PyObject *args) {
    Py_buffer keys, ids, first;
    if (!PyArg_ParseTuple(args, "y*w*w*", &keys, &ids, &first)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = keys.len / (Py_ssize_t)sizeof(int64_t);
    if (keys.len % (Py_ssize_t)sizeof(int64_t) != 0) {
        PyErr_SetString(PyExc_ValueError, "first_seen: keys are not a whole number of int64s");
    } else if (writable_int64s(&ids, rows, "ids") && writable_int64s(&first, rows, "first")) {
        int64_t number;
        Py_BEGIN_ALLOW_THREADS
        number = number_keys((const int64_t *)keys.buf, rows, (int64_t *)ids.buf, (int64_t *)first.buf);
        Py_END_ALLOW_THREADS
        result = number < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(number);
    }
    PyBuffer_Release(&keys);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&first);
    return result;
}

static PyMethodDef methods[] = {
    {"first_seen", first_seen, METH_VARARGS,
     "first_seen(keys, ids, first) -> number: each int64 key's id (dense, in the order keys first "
     "appear) into ids, each id's first row into first; C-contiguous int64 buffers of the keys' length"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kinspect.analyze._dense", "Dense ids of int64 keys (kinspect.analyze.groups).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__dense(void) {
    return PyModule_Create(&module);
}
