/* _hot.c, part 2: evaluate the compiled programs (Python int semantics on int64; any overflow or
 * division by zero bails to the twin, which raises what Python raises) and pack kernel arguments. */

static int floordiv(int64_t a, int64_t b, int64_t *out) {
    if (b == 0 || (a == INT64_MIN && b == -1)) return BAIL;
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    *out = q;
    return 0;
}

static int binary(int64_t op, int64_t a, int64_t b, int64_t *out) {
    int64_t q;
    switch (op) {
    case OP_ADD: return __builtin_add_overflow(a, b, out) ? BAIL : 0;
    case OP_SUB: return __builtin_sub_overflow(a, b, out) ? BAIL : 0;
    case OP_MUL: return __builtin_mul_overflow(a, b, out) ? BAIL : 0;
    case OP_FLOORDIV: return floordiv(a, b, out);
    case OP_FLOORMOD:
        if (floordiv(a, b, &q)) return BAIL;
        *out = a - q * b;
        return 0;
    case OP_TRUNCDIV:
    case OP_TRUNCMOD:
        if (b == 0 || (a == INT64_MIN && b == -1)) return BAIL;
        *out = op == OP_TRUNCDIV ? a / b : a % b;
        return 0;
    case OP_MIN: *out = a < b ? a : b; return 0;
    case OP_MAX: *out = a > b ? a : b; return 0;
    default: return BAIL;
    }
}

static int run_prog(const Prog *p, const Call *k, int64_t *out) {
    int64_t stack[MAXPROG];
    int top = 0;
    for (int i = 0; i < p->n; i++) {
        int64_t op = p->code[i];
        if (op == OP_CONST || op == OP_SYM) {
            int64_t v = p->code[++i];
            if (op == OP_SYM) {
                if (!k->sym_ok[v]) return BAIL;
                v = k->sym[v];
            }
            stack[top++] = v;
        } else if (op == OP_NEG) {
            if (top < 1 || stack[top - 1] == INT64_MIN) return BAIL;
            stack[top - 1] = -stack[top - 1];
        } else {
            if (top < 2 || binary(op, stack[top - 2], stack[top - 1], &stack[top - 2])) return BAIL;
            top--;
        }
    }
    if (top != 1) return BAIL;
    *out = stack[0];
    return 0;
}

/* An int64 into an 8-byte slot of integer dtype `t` (little-endian, zero padding); BAIL if out of range. */
static int pack_int(int t, int64_t v, uint64_t *slot) {
    static const int64_t lo[] = {INT8_MIN, INT16_MIN, INT32_MIN, INT64_MIN, 0, 0, 0, 0};
    static const int64_t hi[] = {INT8_MAX, INT16_MAX, INT32_MAX, INT64_MAX, UINT8_MAX, UINT16_MAX, UINT32_MAX,
                                 INT64_MAX};
    static const uint64_t mask[] = {0xFF, 0xFFFF, 0xFFFFFFFF, ~0ULL, 0xFF, 0xFFFF, 0xFFFFFFFF, ~0ULL};
    if (t > T_U64) {
        if (t == T_F32) {
            float f = (float)(double)v;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            *slot = bits;
            return 0;
        }
        if (t == T_F64) {
            double f = (double)v;
            memcpy(slot, &f, 8);
            return 0;
        }
        return BAIL; /* half types and bool: the twin converts them */
    }
    if (v < lo[t] || v > hi[t]) return BAIL;
    *slot = (uint64_t)v & mask[t];
    return 0;
}

/* A scalar parameter passed through unchanged: exact ints and floats inside the type's range. */
static int pack_object(int t, PyObject *o, uint64_t *slot) {
    int64_t v;
    if (PyLong_CheckExact(o) || o == Py_True || o == Py_False) {
        return scalar_of(o, &v) ? BAIL : pack_int(t, v, slot);
    }
    if (!PyFloat_CheckExact(o) || (t != T_F32 && t != T_F64 && t != T_BF16)) return BAIL;
    double d = PyFloat_AsDouble(o);
    if (t == T_F64) {
        memcpy(slot, &d, 8);
        return 0;
    }
    /* +-inf packs as itself (the "no clamp" sentinel of some ops); NaN and finite values past the
     * type's largest go to the twin, which packs the NaN or raises */
    double lim = t == T_F32 ? 3.4028234663852886e38 : 3.3895313892515355e38;
    if (!(d <= lim && d >= -lim) && !__builtin_isinf(d)) return BAIL;
    float f = (float)d;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (t == T_BF16) bits = ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & 0xFFFFu;
    *slot = bits;
    return 0;
}
