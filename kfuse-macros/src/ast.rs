//! The small AST of a `#[kfuse]` kernel: what [`crate::parse`] keeps of the `syn` tree.
//!
//! Every node carries an [`Sp`] (its first and last token) so that any later error —
//! from name resolution in [`crate::lower`] or from the IR builder in
//! [`crate::validate`] — lands on the user's code. Operators reuse the IR's enums.
//!
//! Statements are a list; a loop (`for k in (0..K).step_by(BK) { .. }`) is a
//! [`Stmt::For`] holding its body as a nested `Vec<Stmt>`.

use kfuse_ir::{BinaryOp, DType, UnaryOp};
use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::ToTokens;

/// A source range: the spans of its first and last token. Errors cover the whole
/// range (`syn::Error::new_spanned` semantics, which works on stable); generated code
/// uses `start`.
#[derive(Clone, Copy, Debug)]
pub struct Sp {
    pub start: Span,
    pub end: Span,
}

impl Sp {
    /// The range of a syntax node's tokens.
    pub fn of(node: &impl ToTokens) -> Sp {
        let mut it = node.to_token_stream().into_iter();
        let start = it.next().map_or_else(Span::call_site, |t| t.span());
        let end = it.last().map_or(start, |t| t.span());
        Sp { start, end }
    }

    pub fn single(span: Span) -> Sp {
        Sp { start: span, end: span }
    }

    /// From the start of `a` to the end of `b`.
    pub fn to(self, b: Sp) -> Sp {
        Sp { start: self.start, end: b.end }
    }

    /// A `syn::Error` covering this range.
    pub fn error(self, msg: impl std::fmt::Display) -> syn::Error {
        syn::Error::new_spanned(self, msg)
    }
}

impl ToTokens for Sp {
    /// Two placeholder tokens carrying the two spans (for `syn::Error::new_spanned`).
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend([TokenTree::Ident(Ident::new("__start", self.start)), TokenTree::Ident(Ident::new("__end", self.end))]);
    }
}

/// An element type as written: `T` (a generic, by position) or `f32`/`f16`/`bf16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTy {
    Generic(usize),
    Concrete(DType),
}

/// The kernel: the annotated function.
pub struct Kernel {
    /// Attributes of the function (doc comments included); kept on the wrapper.
    pub attrs: Vec<syn::Attribute>,
    pub vis: syn::Visibility,
    pub name: Ident,
    /// The dtype generics (`T` in `<T: Float>`), in order.
    pub generics: Vec<Ident>,
    pub params: Vec<Param>,
    pub body: Vec<Stmt>,
}

pub struct Param {
    pub name: Ident,
    pub kind: ParamKind,
    pub sp: Sp,
}

pub enum ParamKind {
    /// `x: Tensor<D, (S1, ..)>` (`output: false`) or `x: &mut Tensor<D, (S1, ..)>`.
    Tensor { dtype: DTy, dims: Vec<Ident>, output: bool },
    /// `eps: f32`, `n: i64`.
    Scalar(DType),
    /// A parameter that did not parse (an error was reported); the fallback wrapper
    /// still lists it so that calls keep their arity.
    Invalid,
}

/// One name of a `let` pattern; `None` for `_`.
pub struct Binding {
    pub name: Option<Ident>,
    pub mutable: bool,
}

pub enum Stmt {
    /// `let a = e;`, `let mut a = e;`, `let (a, b) = (e1, e2);` — `names` and `values`
    /// have the same length.
    Let { names: Vec<Binding>, values: Vec<Expr> },
    /// `a = e;` (`op: None`) or `a += e;` and friends; `sp` covers the statement.
    Assign { target: Ident, op: Option<BinaryOp>, value: Expr, sp: Sp },
    /// An expression statement (`out.block(..).store(v);`), or the tail expression.
    Expr(Expr),
    /// A loop.
    For(Box<For>),
}

/// `for var in lo..hi { body }` (`step: None`) or `for var in (lo..hi).step_by(step) {
/// body }`; `var` is `None` for `_`. `range` covers the expression after `in` (errors
/// of the bounds land there), `sp` the `for` keyword.
pub struct For {
    pub var: Option<Ident>,
    pub lo: Expr,
    pub hi: Expr,
    pub step: Option<Expr>,
    pub body: Vec<Stmt>,
    pub range: Sp,
    pub sp: Sp,
}

pub struct Expr {
    pub kind: ExprKind,
    pub sp: Sp,
}

/// A literal; `suffix` is the dtype of a suffixed literal (`1.0f32`, `2i64`), which
/// makes it a definite constant instead of a weak literal that adapts to its operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lit {
    pub value: kfuse_ir::Literal,
    pub suffix: Option<DType>,
}

pub enum ExprKind {
    Lit(Lit),
    Var(Ident),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `f(args)` or `f::<turbofish>(args)`; the expression's span covers `f(..)`.
    Call { func: Ident, turbofish: Vec<syn::Type>, args: Vec<Expr> },
    /// `receiver.method::<turbofish>(args)`; `call` spans `method::<..>(..)`.
    Method { receiver: Box<Expr>, method: Ident, turbofish: Vec<syn::Type>, args: Vec<Expr>, call: Sp },
    /// `[a, b]`: block offsets and extents, permutations.
    Array(Vec<Expr>),
    /// `_`: a block extent meaning "indexed by the offset, not tiled".
    Infer,
}
