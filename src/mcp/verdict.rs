//! Applying per-element decisions to a classified request: answer it, forward it, or forward
//! the admitted part of a batch and merge the refusals into the answer.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, Request, header};

use super::reply;
use crate::call::{Call, Calls};
use crate::rejection::Rejection;

/// Response extension: the calls (by position in the client's body) that a stage refused (their
/// charges are already given back), so a stage before it knows its call did not run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RefusedCalls(pub(crate) Vec<u32>);

impl RefusedCalls {
    pub(crate) fn of(response: &Response) -> &[u32] {
        response
            .extensions()
            .get::<RefusedCalls>()
            .map_or(&[], |r| r.0.as_slice())
    }
}

/// The answers to the refused elements of a batch whose other elements were forwarded.
pub(crate) struct Merge {
    elements: Vec<Vec<u8>>,
    refused: Vec<u32>,
}

/// Merges the refusals into the inner service's answer and records them.
pub(crate) fn merge(response: Response, merge: Merge) -> Response {
    let mut response = reply::merge(response, merge.elements);
    let mut refused = response
        .extensions_mut()
        .remove::<RefusedCalls>()
        .unwrap_or_default();
    refused.0.extend(merge.refused);
    response.extensions_mut().insert(refused);
    response
}

/// What to do with a request once each of its calls was decided.
pub(crate) enum Verdict {
    /// Call the inner service; merge these answers to refused elements into its answer.
    Forward {
        request: Request<Body>,
        merge: Option<Merge>,
    },
    /// Every element was refused: answer without calling the inner service.
    Answer(Response),
}

/// Applies `rejected` (indices into the request's [`Calls`], ascending) to `request`.
pub(crate) fn apply(mut request: Request<Body>, rejected: &[(usize, Rejection)]) -> Verdict {
    let Some(calls) = request
        .extensions()
        .get::<Calls>()
        .filter(|_| !rejected.is_empty())
    else {
        return Verdict::Forward {
            request,
            merge: None,
        };
    };
    for (i, r) in rejected {
        // A refusal is not work: the stages before give back what they charged.
        calls.calls[*i].charges().refund();
        calls.refusals.refused(&calls.calls[*i], r);
    }
    let refused = rejected.iter().map(|(i, _)| calls.calls[*i].seq).collect();
    if rejected.len() == calls.len() {
        let mut response = reply::rejection_response(calls, rejected);
        response.extensions_mut().insert(RefusedCalls(refused));
        return Verdict::Answer(response);
    }
    let merge = Merge {
        elements: reply::rejection_elements(calls, rejected),
        refused,
    };
    let remaining = without(calls, rejected);
    let body = remaining.body.clone();
    request
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    request.extensions_mut().insert(remaining);
    *request.body_mut() = Body::from(body);
    Verdict::Forward {
        request,
        merge: Some(merge),
    }
}

/// `calls` without the `rejected` elements: a new batch body of the others' exact bytes.
fn without(calls: &Calls, rejected: &[(usize, Rejection)]) -> Calls {
    let mut skip = rejected.iter().map(|(i, _)| *i).peekable();
    let kept: Vec<usize> = (0..calls.len())
        .filter(|i| {
            if skip.peek() == Some(i) {
                skip.next();
                false
            } else {
                true
            }
        })
        .collect();
    let raws: Vec<Bytes> = kept.iter().map(|&i| calls.raw(i)).collect();
    let body = Bytes::from(reply::join_array(&raws));
    let mut offset = 1;
    let list: std::sync::Arc<[Call]> = kept
        .iter()
        .zip(&raws)
        .map(|(&i, raw)| {
            let mut call = calls.calls[i].clone();
            call.span = offset..offset + raw.len();
            offset += raw.len() + 1;
            call
        })
        .collect();
    Calls {
        calls: list,
        batch: true,
        body,
        format: calls.format.clone(),
        schemas: calls.schemas.clone(),
        refusals: calls.refusals.clone(),
    }
}
