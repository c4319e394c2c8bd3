/* The analyze job's grouping kernels in C: kinspect.analyze.groups.first_seen and
 * kinspect.analyze.partials' histogram sums, each beside its Python reference.
 *
 * first_seen: the job groups rows by one packed int64 key per row (kinspect/analyze/groups.py).
 * Arrow's dictionary_encode gives the same ids, but costs about 110 ns a row once a piece
 * holds a few hundred thousand distinct keys (the `values` merge); this open-addressing
 * table costs about a third of that.
 *
 * list_sums: the `integers` aggregate sums each group's varint histograms (lists of up to 10
 * counts) element by element. numpy needs a per-count index built by np.repeat first (2M
 * counts a piece: 20 ms of 34); one pass over the lists here needs none.
 *
 * accumulate_codes: a key column's codes (its value's offset from the column's lowest, or a
 * dictionary index, plus one; null 0) folded into the packed key in one pass over Arrow's own
 * buffers, where numpy made five (fill the nulls, convert, widen, add one, multiply and add).
 *
 * sort_int64: the `values` aggregate counts its packed keys (most of them distinct) by sorting
 * them. numpy's sort of int64 is a comparison sort on this machine's processors (about 54 ns a
 * key for 1.5M keys); a least-significant-digit radix sort of the keys' offsets from their
 * minimum takes a pass per 11 bits of their range (a packed key spans 30 to 40 bits).
 *
 * tests/analyze/test_grouping_native.py checks each against its Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* sums[ids[i] * width + p] += values[offsets[i] + p] for each list i and each p below its
 * length and below width. */
static void add_lists(const int64_t *ids, const int64_t *offsets, Py_ssize_t lists, const int64_t *values,
                      int64_t width, int64_t *sums) {
    for (Py_ssize_t i = 0; i < lists; i++) {
        int64_t start = offsets[i], length = offsets[i + 1] - start;
        int64_t *row = sums + ids[i] * width;
        const int64_t *counts = values + start;
        if (length > width) {
            length = width;
        }
        for (int64_t p = 0; p < length; p++) {
            row[p] += counts[p];
        }
    }
}

static PyObject *list_sums(PyObject *module, PyObject *args) {
    Py_buffer ids, offsets, values, sums;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*", &ids, &offsets, &values, &width, &sums)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t lists = ids.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t counts = values.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t cells = sums.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *group = ids.buf, *offset = offsets.buf;
    int ok = width > 0 && offsets.len == (lists + 1) * (Py_ssize_t)sizeof(int64_t);
    /* every offset within the values and never decreasing, every id within the sums: checked
     * before anything is added, so a bad call changes nothing */
    for (Py_ssize_t i = 0; ok && i < lists; i++) {
        ok = offset[i] >= 0 && offset[i] <= offset[i + 1] && offset[i + 1] <= counts && group[i] >= 0 &&
             group[i] < cells / width;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "list_sums: offsets must be one more than ids, ascending within the values, and every id "
                        "a row of sums");
    } else {
        Py_BEGIN_ALLOW_THREADS
        add_lists(group, offset, lists, (const int64_t *)values.buf, width, (int64_t *)sums.buf);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&values);
    PyBuffer_Release(&sums);
    return result;
}

/* key[r] = code (first) or key[r] * span + code, code = values[r] - low + 1 where valid, else null_code */
#define ACCUMULATE(type)                                                                                  \
    static void accumulate_##type(int64_t *key, const type *values, Py_ssize_t rows, const uint8_t *valid,  \
                                  Py_ssize_t bit, int64_t low, int64_t span, int64_t null_code, int first) { \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                           \
            int64_t code = (int64_t)values[r] - low + 1;                                                  \
            if (valid != NULL && !((valid[(bit + r) >> 3] >> ((bit + r) & 7)) & 1)) {                      \
                code = null_code;                                                                         \
            }                                                                                             \
            key[r] = first ? code : key[r] * span + code;                                                 \
        }                                                                                                 \
    }
ACCUMULATE(int8_t)
ACCUMULATE(int16_t)
ACCUMULATE(int32_t)
ACCUMULATE(int64_t)
ACCUMULATE(uint8_t)
ACCUMULATE(uint16_t)
ACCUMULATE(uint32_t)

static PyObject *accumulate_codes(PyObject *module, PyObject *args) {
    Py_buffer key, values, validity;
    Py_ssize_t itemsize, bit;
    int is_signed, first;
    long long low, span, null_code;
    if (!PyArg_ParseTuple(args, "w*y*npy*nLLLp", &key, &values, &itemsize, &is_signed, &validity, &bit, &low, &span,
                          &null_code, &first)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = key.len / (Py_ssize_t)sizeof(int64_t);
    int width_ok = itemsize == 1 || itemsize == 2 || itemsize == 4 || (itemsize == 8 && is_signed);
    /* every buffer long enough, checked before anything is written: a bad call changes nothing */
    if (key.len % (Py_ssize_t)sizeof(int64_t) != 0 || !width_ok || values.len < rows * itemsize || bit < 0 ||
        (validity.len > 0 && validity.len * 8 < bit + rows) || span < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "accumulate_codes: key must be int64s, values as many items of 1, 2 or 4 bytes (or 8, "
                        "signed), the validity bitmap (or empty) cover them from its bit offset, and span be at "
                        "least 1");
    } else {
        const uint8_t *valid = validity.len > 0 ? (const uint8_t *)validity.buf : NULL;
        int64_t *out = (int64_t *)key.buf;
        Py_BEGIN_ALLOW_THREADS
        switch (itemsize * (is_signed ? 1 : -1)) {
        case 1: accumulate_int8_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 2: accumulate_int16_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 4: accumulate_int32_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 8: accumulate_int64_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case -1: accumulate_uint8_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case -2: accumulate_uint16_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        default: accumulate_uint32_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&values);
    PyBuffer_Release(&validity);
    return result;
}

#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)

/* keys ascending, by their offsets from the least of them, RADIX_BITS at a time (a stable
 * counting pass each, between keys and scratch); a digit that every key shares is skipped.
 * 0 when out of memory (keys unchanged). */
static int radix_sort(int64_t *keys, int64_t *scratch, Py_ssize_t n) {
    if (n < 2) {
        return 1;
    }
    int64_t low = keys[0], high = keys[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        low = keys[i] < low ? keys[i] : low;
        high = keys[i] > high ? keys[i] : high;
    }
    uint64_t range = (uint64_t)high - (uint64_t)low; /* unsigned: no overflow for any two int64s */
    if (range == 0) {
        return 1;
    }
    int passes = (64 - __builtin_clzll(range) + RADIX_BITS - 1) / RADIX_BITS;
    Py_ssize_t (*counts)[RADIX_SIZE] = calloc((size_t)passes, sizeof *counts);
    if (counts == NULL) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* every pass's histogram in one read of the keys */
        uint64_t offset = (uint64_t)keys[i] - (uint64_t)low;
        for (int p = 0; p < passes; p++) {
            counts[p][(offset >> (p * RADIX_BITS)) & (RADIX_SIZE - 1)]++;
        }
    }
    int64_t *from = keys, *to = scratch;
    for (int p = 0; p < passes; p++) {
        Py_ssize_t *count = counts[p], total = 0;
        int shared = 0;
        for (int d = 0; d < RADIX_SIZE; d++) {
            shared |= count[d] == n;
            Py_ssize_t here = count[d];
            count[d] = total; /* where digit d's keys start */
            total += here;
        }
        if (shared) {
            continue;
        }
        int shift = p * RADIX_BITS;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t offset = (uint64_t)from[i] - (uint64_t)low;
            to[count[(offset >> shift) & (RADIX_SIZE - 1)]++] = from[i];
        }
        int64_t *swap = from;
        from = to;
        to = swap;
    }
    if (from != keys) {
        memcpy(keys, from, (size_t)n * sizeof(int64_t));
    }
    free(counts);
    return 1;
}

static PyObject *sort_int64(PyObject *module, PyObject *args) {
    Py_buffer keys, scratch;
    if (!PyArg_ParseTuple(args, "w*w*", &keys, &scratch)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = keys.len / (Py_ssize_t)sizeof(int64_t);
    if (keys.len % (Py_ssize_t)sizeof(int64_t) != 0 || scratch.len < keys.len) {
        PyErr_SetString(PyExc_ValueError, "sort_int64: keys must be int64s and scratch at least as long");
    } else {
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = radix_sort((int64_t *)keys.buf, (int64_t *)scratch.buf, n);
        Py_END_ALLOW_THREADS
        result = ok ? Py_NewRef(Py_None) : PyErr_NoMemory();
    }
    PyBuffer_Release(&keys);
    PyBuffer_Release(&scratch);
    return result;
}

static PyMethodDef methods[] = {
    {"first_seen", first_seen, METH_VARARGS,
     "first_seen(keys, ids, first) -> number: each int64 key's id (dense, in the order keys first "
     "appear) into ids, each id's first row into first; C-contiguous int64 buffers of the keys' length"},
    {"list_sums", list_sums, METH_VARARGS,
     "list_sums(ids, offsets, values, width, sums): adds the first `width` counts of list i (values "
     "offsets[i] to offsets[i + 1]) into row ids[i] of sums (groups x width); int64 buffers"},
    {"accumulate_codes", accumulate_codes, METH_VARARGS,
     "accumulate_codes(key, values, itemsize, signed, validity, bit_offset, low, span, null_code, first): "
     "key[r] = code if first else key[r] * span + code, code = values[r] - low + 1 where the validity bitmap "
     "(empty: all valid) has bit bit_offset + r set, else null_code; key an int64 buffer"},
    {"sort_int64", sort_int64, METH_VARARGS,
     "sort_int64(keys, scratch): sorts the int64 buffer keys ascending in place (a radix sort), using "
     "scratch (an int64 buffer at least as long) as room"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kinspect.analyze._dense", "The analyze job's grouping kernels (kinspect.analyze.groups, .partials).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__grouping(void) {
    return PyModule_Create(&module);
}
