"""A low-rank matrix ``A @ B`` kept as its two factors.

Circuit matrices of attention heads are products of thin factors: the OV circuit
``W_V W_O`` is ``[d_model, d_head] @ [d_head, d_model]``, of rank at most ``d_head``.
:class:`FactoredMatrix` keeps ``A`` and ``B`` and answers questions about ``AB``
(eigenvalues, singular values, norm, products with other matrices) from the factors,
at a cost that grows with ``mdim`` (``d_head``) rather than with ``ldim * rdim``.

Axis names used in the annotations:

- ``*batch``: leading dims shared by ``A`` and ``B`` (e.g. ``n_layers n_heads``),
- ``ldim``: rows of ``AB`` (``m``), ``rdim``: columns of ``AB`` (``n``),
- ``mdim``: the inner dim ``k`` that ``AB`` is factored through.

The file is long (about 500 lines) but holds one concept, one class: every method answers
a question about ``AB`` from its two factors, and :func:`linalg_dtype` is the one helper
those methods share; most of the length is the math in the docstrings.
"""

from collections.abc import Iterator, Sequence
from typing import Any, Union

import torch
from jaxtyping import Complex, Float

_OPERAND_DOC = "a FactoredMatrix or a floating-point torch.Tensor"
_HALF = (torch.float16, torch.bfloat16)


def linalg_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a decomposition of ``dtype`` factors runs in: ``float32`` for ``float16``
    and ``bfloat16`` (torch has no half-precision eig or QR on the CPU, and half precision
    would keep about three digits of a spectrum), else ``dtype`` itself.

    Example:
        >>> import torch
        >>> from vecinterp.factored_matrix import linalg_dtype
        >>> linalg_dtype(torch.bfloat16), linalg_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in _HALF else dtype


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy broadcasting of two shapes, or ``None`` if they do not broadcast.

    ``torch.broadcast_shapes`` gives the same answer but its first call imports torch's
    symbolic-shape machinery (0.6 s)."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


class FactoredMatrix:
    """The product ``AB`` of ``A [*batch, m, k]`` and ``B [*batch, k, n]``, formed only on request.

    A :class:`FactoredMatrix` is an immutable value: its factors cannot be reassigned and
    every operation returns a new object. (The factor tensors are not copied, so editing
    them in place would still change it; don't.) Leading dims of ``A`` and ``B`` are
    broadcast against each other at construction, so ``fm.A`` and ``fm.B`` always share
    the same leading shape (possibly as expanded, stride-0 views).

    Costs, with ``k = mdim`` small: ``eigenvalues``, ``svd``, ``singular_values`` and
    ``norm`` cost ``O((m + n) k^2 + k^3)`` per leading index instead of the ``O(m n k)``
    of forming ``AB`` plus ``O(min(m, n)^3)`` for a dense decomposition.

    Half precision: with ``float16`` or ``bfloat16`` factors, ``eigenvalues``, ``svd``,
    ``singular_values`` and ``norm`` upcast the factors to ``float32`` and return
    ``float32`` results (``complex64`` eigenvalues), as TransformerLens does; products,
    ``AB`` and ``BA`` stay in the factors' dtype.

    Args:
        A: left factor ``[*batch_a, m, k]``.
        B: right factor ``[*batch_b, k, n]``; ``batch_a`` and ``batch_b`` must broadcast.
            Both must be finite floating-point tensors of the same dtype and device.

    Raises:
        TypeError: a factor is not a floating-point tensor, or dtypes/devices differ.
        ValueError: a factor has fewer than 2 dims or an empty matrix axis, the inner dims
            differ, the leading dims do not broadcast, or a factor holds NaN/inf.

    Example:
        >>> import torch
        >>> from vecinterp import FactoredMatrix
        >>> W_V, W_O = torch.ones(2, 4, 1), torch.ones(2, 1, 4)  # 2 heads, d_model 4, d_head 1
        >>> ov = FactoredMatrix(W_V, W_O)
        >>> ov
        FactoredMatrix(shape=(2, 4, 4), A=(2, 4, 1), B=(2, 1, 4), dtype=torch.float32, device=cpu)
        >>> ov.eigenvalues.real.tolist()  # only the nonzero one, from the 1x1 matrix BA
        [[4.0], [4.0]]
    """

    __slots__ = ("_A", "_B")
    _A: torch.Tensor
    _B: torch.Tensor

    # Make numpy defer to __rmatmul__ (which declines) instead of iterating over us.
    __array_ufunc__ = None

    # Plain ``torch.Tensor`` annotations: the checks below name both shapes, which a
    # shape-annotation failure could not.
    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        for name, factor in (("A", A), ("B", B)):
            if not isinstance(factor, torch.Tensor):
                raise TypeError(
                    f"FactoredMatrix: {name} must be a torch.Tensor, got {type(factor)}"
                )
            if not torch.is_floating_point(factor):
                raise TypeError(
                    f"FactoredMatrix: {name} must be a floating-point tensor, got {factor.dtype}"
                )
            if factor.ndim < 2:
                raise ValueError(
                    f"FactoredMatrix: {name} must have at least 2 dims [..., rows, cols], "
                    f"got shape {_shape(factor)}"
                )
        if A.dtype != B.dtype:
            raise TypeError(f"FactoredMatrix: A is {A.dtype} but B is {B.dtype}; cast one of them")
        if A.device != B.device:
            raise TypeError(f"FactoredMatrix: A is on {A.device} but B is on {B.device}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"FactoredMatrix: inner dims differ: A {_shape(A)} has {A.shape[-1]} columns, "
                f"B {_shape(B)} has {B.shape[-2]} rows"
            )
        if 0 in (A.shape[-2], A.shape[-1], B.shape[-1]):
            raise ValueError(f"FactoredMatrix: empty matrix axis in A {_shape(A)} @ B {_shape(B)}")
        batch = _broadcast(A.shape[:-2], B.shape[:-2])
        if batch is None:
            raise ValueError(
                f"FactoredMatrix: leading dims of A {_shape(A)} and B {_shape(B)} do not broadcast"
            )
        for name, factor in (("A", A), ("B", B)):
            if not bool(torch.isfinite(factor).all()):
                raise ValueError(f"FactoredMatrix: {name} {_shape(factor)} contains NaN or inf")
        object.__setattr__(self, "_A", A.expand(*batch, *A.shape[-2:]))
        object.__setattr__(self, "_B", B.expand(*batch, *B.shape[-2:]))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"FactoredMatrix is immutable (cannot set {name!r}); build a new FactoredMatrix"
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"FactoredMatrix is immutable (cannot delete {name!r})")

    def __reduce__(self) -> tuple[type, tuple[torch.Tensor, torch.Tensor]]:
        # Needed by copy and pickle, whose default slot restore goes through __setattr__.
        return (FactoredMatrix, (self._A, self._B))

    # ------------------------------------------------------------------ factors and shape

    @property
    def A(self) -> Float[torch.Tensor, "*batch ldim mdim"]:
        """Left factor ``[*batch, m, k]``."""
        return self._A

    @property
    def B(self) -> Float[torch.Tensor, "*batch mdim rdim"]:
        """Right factor ``[*batch, k, n]``."""
        return self._B

    @property
    def AB(self) -> Float[torch.Tensor, "*batch ldim rdim"]:
        """The dense product ``A @ B`` ``[*batch, m, n]``, materialised on each access."""
        return self._A @ self._B

    @property
    def BA(self) -> Float[torch.Tensor, "*batch mdim mdim"]:
        """The small product ``B @ A`` ``[*batch, k, k]``; defined only when ``m == n``.

        ``BA`` shares the nonzero eigenvalues of ``AB`` (see :attr:`eigenvalues`).

        Raises:
            ValueError: ``AB`` is not square, so ``B @ A`` is undefined.
        """
        self._require_square("BA")
        return self._B @ self._A

    @property
    def T(self) -> "FactoredMatrix":
        """The transpose ``(AB)^T = B^T A^T``, as ``FactoredMatrix(B^T, A^T)``."""
        return FactoredMatrix(self._B.mT, self._A.mT)

    @property
    def shape(self) -> torch.Size:
        """Shape of ``AB``, ``(*batch, m, n)``."""
        return torch.Size((*self._A.shape[:-2], self.ldim, self.rdim))

    @property
    def ldim(self) -> int:
        """Rows of ``AB`` (``m``)."""
        return self._A.shape[-2]

    @property
    def rdim(self) -> int:
        """Columns of ``AB`` (``n``)."""
        return self._B.shape[-1]

    @property
    def mdim(self) -> int:
        """The inner dim ``k`` that ``AB`` is factored through (an upper bound on its rank)."""
        return self._A.shape[-1]

    @property
    def ndim(self) -> int:
        """Number of dims of ``AB``, ``len(batch) + 2``."""
        return self._A.ndim

    @property
    def dtype(self) -> torch.dtype:
        """Dtype shared by both factors."""
        return self._A.dtype

    @property
    def device(self) -> torch.device:
        """Device shared by both factors."""
        return self._A.device

    def __repr__(self) -> str:
        return (
            f"FactoredMatrix(shape={tuple(self.shape)}, A={_shape(self._A)}, "
            f"B={_shape(self._B)}, dtype={self.dtype}, device={self.device})"
        )

    # ------------------------------------------------------------------ products

    # ``other: object``: a binary operator must answer NotImplemented for types it does not
    # know (so Python can try the reflected operator), not fail a type check.
    def __matmul__(self, other: object) -> Union["FactoredMatrix", Float[torch.Tensor, "..."]]:
        """``AB @ other``, associated so the result stays factored through the smallest dim.

        - ``other`` a vector ``[n]``: returns the dense ``A @ (B @ v)``, ``[*batch, m]``.
        - ``other`` a matrix ``M [*batch_o, n, p]``: the candidates are
          ``FactoredMatrix(A, B @ M)`` (inner dim ``k``) and ``FactoredMatrix(AB, M)``
          (inner dim ``n``); the smaller inner dim wins, ties keep ``A`` (no ``AB`` formed).
        - ``other`` a FactoredMatrix ``A2 B2`` (``A2 [n, k2]``, ``B2 [k2, p]``): the
          candidates are ``(A, (B A2) B2)`` through ``k``, ``(A (B A2), B2)`` through
          ``k2`` and ``(AB, A2 B2)`` through ``n``; the smallest wins, ties in that order.

        Keeping the smallest inner dim keeps every later operation cheap, and
        materialises at most an ``[m, n]``-sized factor when ``n`` is the smallest dim.
        Leading dims broadcast as in :func:`torch.matmul`. Any other type of ``other`` gives
        NotImplemented, so Python raises its usual ``TypeError``.

        Raises:
            ValueError: ``other``'s rows do not match ``rdim``, or leading dims do not broadcast.
            TypeError: dtype or device differs from this matrix's.

        Example:
            >>> import torch
            >>> from vecinterp import FactoredMatrix
            >>> fm = FactoredMatrix(torch.ones(5, 2), torch.ones(2, 5))
            >>> (fm @ torch.ones(5, 3)).mdim, (fm @ torch.ones(5)).tolist()
            (2, [10.0, 10.0, 10.0, 10.0, 10.0])
        """
        if isinstance(other, FactoredMatrix):
            return self._matmul_factored(other)
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        self._check_operand(other, "right")
        A, B = self._A, self._B
        if other.ndim == 1:
            return (A @ (B @ other.unsqueeze(-1))).squeeze(-1)
        if self.mdim <= self.rdim:
            return FactoredMatrix(A, B @ other)
        return FactoredMatrix(A @ B, other)

    def __rmatmul__(self, other: object) -> Union["FactoredMatrix", Float[torch.Tensor, "..."]]:
        """``other @ AB``, the mirror image of :meth:`__matmul__`.

        - ``other`` a vector ``[m]``: returns the dense ``(v @ A) @ B``, ``[*batch, n]``.
        - ``other`` a matrix ``M [*batch_o, p, m]``: ``FactoredMatrix(M @ A, B)`` (inner dim
          ``k``) or ``FactoredMatrix(M, AB)`` (inner dim ``m``), the smaller winning and
          ties keeping ``B``.
        """
        if isinstance(other, FactoredMatrix):
            return other._matmul_factored(self)
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        self._check_operand(other, "left")
        A, B = self._A, self._B
        if other.ndim == 1:
            return ((other.unsqueeze(-2) @ A) @ B).squeeze(-2)
        if self.mdim <= self.ldim:
            return FactoredMatrix(other @ A, B)
        return FactoredMatrix(other, A @ B)

    def _matmul_factored(self, other: "FactoredMatrix") -> "FactoredMatrix":
        if self.rdim != other.ldim:
            raise ValueError(
                f"FactoredMatrix @ FactoredMatrix: shapes {tuple(self.shape)} and "
                f"{tuple(other.shape)} do not chain ({self.rdim} != {other.ldim})"
            )
        self._check_operand(other.A, "right")
        A1, B1, A2, B2 = self._A, self._B, other.A, other.B
        inner = min(self.mdim, other.mdim, self.rdim)
        if inner == self.mdim:
            return FactoredMatrix(A1, (B1 @ A2) @ B2)
        if inner == other.mdim:
            return FactoredMatrix(A1 @ (B1 @ A2), B2)
        return FactoredMatrix(A1 @ B1, A2 @ B2)

    def _check_operand(self, other: torch.Tensor, side: str) -> None:
        """Fail with a message naming both shapes before torch.matmul would."""
        if not torch.is_floating_point(other):
            raise TypeError(f"FactoredMatrix @: operand must be {_OPERAND_DOC}, got {other.dtype}")
        if other.dtype != self.dtype or other.device != self.device:
            raise TypeError(
                f"FactoredMatrix @: operand is {other.dtype} on {other.device}, "
                f"but the matrix is {self.dtype} on {self.device}"
            )
        if other.ndim == 0:
            raise ValueError("FactoredMatrix @: operand must have at least 1 dim, got a scalar")
        if side == "right":
            axis, needed, expr = (-2 if other.ndim > 1 else -1), self.rdim, "fm @ x"
        else:
            axis, needed, expr = -1, self.ldim, "x @ fm"
        if other.shape[axis] != needed:
            raise ValueError(
                f"{expr}: matrix of shape {tuple(self.shape)} cannot multiply operand of "
                f"shape {_shape(other)} (needs {needed} along axis {axis})"
            )
        if other.ndim > 2 and _broadcast(self._A.shape[:-2], other.shape[:-2]) is None:
            raise ValueError(
                f"{expr}: leading dims of matrix {tuple(self.shape)} and operand "
                f"{_shape(other)} do not broadcast"
            )

    # ------------------------------------------------------------------ spectra and norms

    @property
    def eigenvalues(self) -> Complex[torch.Tensor, "*batch n_eig"]:
        """Eigenvalues of square ``AB``, from whichever of ``AB`` and ``BA`` is smaller.

        Why the small side suffices: if ``ABx = λx`` with ``λ ≠ 0`` then ``Bx ≠ 0`` and
        ``BA(Bx) = B(ABx) = λ(Bx)``, so ``λ`` is an eigenvalue of ``BA``, and symmetrically.
        With multiplicities, Sylvester's determinant identity gives
        ``λ^k det(λI_m − AB) = λ^m det(λI_k − BA)``: the two spectra agree except for
        ``|m − k|`` extra zeros on the larger side.

        So when ``k < m`` this returns ``eig(BA)``, ``[*batch, k]`` (all nonzero eigenvalues
        of ``AB``, plus zeros where ``BA`` is singular); when ``k >= m`` it returns
        ``eig(AB)``, ``[*batch, m]``, already the smaller matrix. Either way the output has
        ``min(m, k)`` eigenvalues, in no particular order, as a complex tensor
        (``complex128`` for ``float64`` factors). Sums such as the copying score
        ``Re(Σλ) / Σ|λ|`` are unaffected by the dropped zeros. TransformerLens's property
        of the same name always returns ``eig(BA)``, ``k`` values: ``k - m`` more (zeros)
        than this when ``k > m`` (``docs/migrating.rst``, "Habits that behave
        differently").

        Raises:
            ValueError: ``AB`` is not square (``m != n``).

        Example:
            >>> import torch
            >>> from vecinterp import FactoredMatrix
            >>> u, v = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[4.0, 5.0, 6.0]])
            >>> FactoredMatrix(u, v).eigenvalues.real.tolist()  # uv^T has eigenvalue v·u
            [32.0]
        """
        self._require_square("eigenvalues")
        A, B = self._linalg_factors()
        small = B @ A if self.mdim < self.ldim else A @ B
        return torch.linalg.eigvals(small)

    def _linalg_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` in the dtype decompositions run in (float32 for half precision)."""
        dtype = linalg_dtype(self.dtype)
        return self._A.to(dtype), self._B.to(dtype)

    def _core(
        self,
    ) -> tuple[
        Float[torch.Tensor, "*batch ldim a"],
        Float[torch.Tensor, "*batch a b"],
        Float[torch.Tensor, "*batch rdim b"],
    ]:
        """``AB = Q_A (R_A R_B^T) Q_B^T`` from reduced QRs ``A = Q_A R_A``, ``B^T = Q_B R_B``.

        ``Q_A`` and ``Q_B`` have orthonormal columns, so the small core ``R_A R_B^T``
        (``[min(m, k), min(n, k)]``) has the singular values and Frobenius norm of ``AB``.
        """
        A, B = self._linalg_factors()
        Q_A, R_A = torch.linalg.qr(A)
        Q_B, R_B = torch.linalg.qr(B.mT)
        return Q_A, R_A @ R_B.mT, Q_B

    def svd(
        self,
    ) -> tuple[
        Float[torch.Tensor, "*batch ldim r"],
        Float[torch.Tensor, "*batch r"],
        Float[torch.Tensor, "*batch r rdim"],
    ]:
        """Thin SVD ``AB = U diag(S) Vh`` computed through the factors, with ``r = min(m, n, k)``.

        With reduced QRs ``A = Q_A R_A`` and ``B^T = Q_B R_B``,
        ``AB = Q_A (R_A R_B^T) Q_B^T``. Take the SVD of the small core
        ``R_A R_B^T = U_c diag(S) Vh_c``; since ``Q_A`` and ``Q_B`` have orthonormal columns,
        ``U = Q_A U_c`` and ``Vh = Vh_c Q_B^T`` are orthonormal too, and this is an SVD of
        ``AB``. Cost ``O((m + n) k^2 + k^3)``: nothing of size ``m * n`` is formed beyond
        the output singular vectors.

        Returns:
            ``(U [*batch, m, r], S [*batch, r], Vh [*batch, r, n])``, ``S`` descending.
            Vectors for zero singular values are an arbitrary orthonormal completion.

        Example:
            >>> import torch
            >>> from vecinterp import FactoredMatrix
            >>> fm = FactoredMatrix(2 * torch.eye(4)[:, :2], torch.eye(4)[:2, :])
            >>> U, S, Vh = fm.svd()
            >>> S.tolist(), torch.allclose(U @ torch.diag(S) @ Vh, fm.AB)
            ([2.0, 2.0], True)
        """
        Q_A, core, Q_B = self._core()
        U_core, S, Vh_core = torch.linalg.svd(core, full_matrices=False)
        return Q_A @ U_core, S, Vh_core @ Q_B.mT

    @property
    def singular_values(self) -> Float[torch.Tensor, "*batch r"]:
        """Singular values of ``AB``, ``[*batch, min(m, n, k)]``, descending (see :meth:`svd`)."""
        _, core, _ = self._core()
        return torch.linalg.svdvals(core)

    def norm(self) -> Float[torch.Tensor, "*batch"]:
        """Frobenius norm ``‖AB‖_F``, one per leading index, ``[*batch]``.

        ``‖AB‖_F = ‖Q_A (R_A R_B^T) Q_B^T‖_F = ‖R_A R_B^T‖_F`` (orthonormal columns preserve
        the norm), so only the ``[min(m, k), min(n, k)]`` core is formed. Its error is
        about ``eps ‖A‖ ‖B‖``, like the dense product's; the cheaper-looking
        ``sqrt(tr((A^T A)(B B^T)))`` errs by ``eps ‖A‖² ‖B‖²`` in ``‖AB‖²``, which
        swamps the result when ``AB`` is much smaller than ``‖A‖ ‖B‖``.

        Example:
            >>> import torch
            >>> from vecinterp import FactoredMatrix
            >>> FactoredMatrix(torch.eye(4)[:, :2], torch.eye(4)[:2, :]).norm().item()
            1.4142135381698608
        """
        _, core, _ = self._core()
        return torch.linalg.matrix_norm(core)

    def get_corner(self, k: int = 3) -> Float[torch.Tensor, "*batch corner_l corner_r"]:
        """The top-left ``k x k`` block of ``AB`` (smaller if ``AB`` is), formed from the factors.

        Example:
            >>> import torch
            >>> from vecinterp import FactoredMatrix
            >>> FactoredMatrix(torch.ones(9, 1), torch.ones(1, 9)).get_corner(2).tolist()
            [[1.0, 1.0], [1.0, 1.0]]
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"get_corner: k must be a positive int, got {k!r}")
        return self._A[..., :k, :] @ self._B[..., :, :k]

    def _require_square(self, what: str) -> None:
        if self.ldim != self.rdim:
            raise ValueError(
                f"FactoredMatrix.{what} needs a square AB, but shape is {tuple(self.shape)} "
                f"(ldim {self.ldim} != rdim {self.rdim})"
            )

    # ------------------------------------------------------------------ leading dims

    def __getitem__(self, index: Any) -> "FactoredMatrix":
        """Index the leading dims only: ``fm[0]``, ``fm[0, 3]``, ``fm[:, 2]``, ``fm[None]``.

        The same index is applied to ``A`` and ``B``, so ``fm[i].AB == fm.AB[i]``. Indices
        that could reach the two matrix axes (more entries than leading dims, or ``...``)
        raise ``IndexError``: use the dense ``fm.AB[...]`` for those.
        """
        entries = index if isinstance(index, tuple) else (index,)
        batch = tuple(self._A.shape[:-2])
        consumed = 0
        for entry in entries:
            if entry is Ellipsis:
                raise IndexError(
                    "FactoredMatrix indexing does not accept '...', which could reach the "
                    f"matrix axes; index the leading dims {batch} explicitly, or use fm.AB[...]"
                )
            if entry is None:
                continue
            if isinstance(entry, torch.Tensor) and entry.dtype == torch.bool:
                consumed += entry.ndim
            else:
                consumed += 1
        if consumed > len(batch):
            raise IndexError(
                f"FactoredMatrix of shape {tuple(self.shape)} can only be indexed along its "
                f"{len(batch)} leading dim(s) {batch}; the last two axes belong to the product "
                "AB, so index the dense matrix instead: fm.AB[...]"
            )
        return FactoredMatrix(self._A[index], self._B[index])

    def __len__(self) -> int:
        """Size of the first leading dim; a ``TypeError`` if there is none (like a 0-d tensor)."""
        if self._A.ndim == 2:
            raise TypeError(f"len() of an unbatched FactoredMatrix {tuple(self.shape)}")
        return self._A.shape[0]

    def __iter__(self) -> Iterator["FactoredMatrix"]:
        """Iterate over the first leading dim (``TypeError`` when unbatched)."""
        return (self[i] for i in range(len(self)))
