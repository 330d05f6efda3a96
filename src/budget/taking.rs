//! The budget's charge list: the scopes one call was charged to, in order, and the one way to
//! give them back.
//!
//! Admission takes a call's cost from one scope after another: in fixed mode the global limit
//! then the tenant's; in adaptive mode the tenant's share, the global bucket, then the
//! cluster's leases, or, when one of those refuses, the tenant's guaranteed minimum, the
//! global lease and the global bucket (into debt). A [`Taking`] records each scope as it is
//! taken; the first refusal gives back everything taken so far (so the next attempt starts
//! clean), and so does dropping it uncommitted. [`Taking::commit`] turns it into the
//! [`Charged`] list a [`BudgetPermit`](super::BudgetPermit) holds, and
//! [`Charged::give_back`] returns it, latest first, when a later stage refuses the call.

use std::sync::Arc;

use super::gcra::Gcra;
use super::tenants::TenantState;
use crate::distributed::{LeaseGate, Leased};
use crate::rejection::{Reason, Scope};

/// A bucket a call is charged to: the budget's own, or its tenant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bucket {
    /// The fixed-mode global limit.
    FixedGlobal,
    /// The tenant's fixed-mode limit.
    FixedTenant,
    /// The adaptive global bucket.
    Global,
    /// The tenant's share of the global budget.
    Share,
    /// The tenant's guaranteed minimum.
    Guaranteed,
}

/// One scope charged.
#[derive(Debug, Clone, Copy)]
enum Item {
    Bucket(Bucket),
    /// The cluster's leases: what was spent of each.
    Leases(Leased),
}

/// Why a scope refuses a call: the reason and scope of its rejection.
pub(super) type Why = (Reason, Scope);
/// The global budget's (its bucket or its lease).
pub(super) const GLOBAL: Why = (Reason::GlobalBudgetExceeded, Scope::Global);
/// A tenant's share's (its bucket or its lease).
pub(super) const TENANT: Why = (Reason::TenantBudgetExceeded, Scope::Tenant);

/// A refusal before it is a [`Rejection`](crate::rejection::Rejection): why, where, and the
/// nanoseconds until the call could be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) reason: Reason,
    pub(super) scope: Scope,
    pub(super) wait: u64,
}

/// Where the budget's scopes are: its buckets and its gate to the cluster's leases (a
/// tenant's are in the list's [`TenantState`]).
#[derive(Clone, Copy)]
pub(super) struct Ledger<'a> {
    /// The fixed-mode global bucket.
    pub(super) fixed: &'a Gcra,
    /// The adaptive global bucket.
    pub(super) global: &'a Gcra,
    /// The cluster's leases.
    pub(super) leases: &'a LeaseGate,
}

impl<'a> Ledger<'a> {
    /// The bucket, `None` for a tenant's without a tenant.
    fn bucket<'b>(self, bucket: Bucket, tenant: Option<&'b TenantState>) -> Option<&'b Gcra>
    where
        'a: 'b,
    {
        match bucket {
            Bucket::FixedGlobal => Some(self.fixed),
            Bucket::Global => Some(self.global),
            Bucket::FixedTenant => tenant.map(|t| &t.fixed),
            Bucket::Share => tenant.map(|t| &t.share),
            Bucket::Guaranteed => tenant.map(|t| &t.guaranteed),
        }
    }
}

/// A call is charged to three scopes at most (a share, the global bucket and the leases; or
/// the guaranteed minimum, the leases and the global bucket).
const MAX_ITEMS: usize = 3;

/// What an admitted call was charged: its cost, its tenant, and the scopes taken, in order.
#[derive(Debug, Default)]
pub(super) struct Charged {
    tenant: Option<Arc<TenantState>>,
    cost: u64,
    items: [Option<Item>; MAX_ITEMS],
}

impl Charged {
    /// The call's cost (0 for chatter: nothing charged or counted).
    pub(super) fn cost(&self) -> u64 {
        self.cost
    }

    /// The tenant it was charged to, if any.
    pub(super) fn tenant(&self) -> Option<&Arc<TenantState>> {
        self.tenant.as_ref()
    }

    /// Gives every scope back, latest first, and empties the list.
    pub(super) fn give_back(&mut self, ledger: Ledger<'_>, now: u64) {
        let Charged {
            tenant,
            cost,
            items,
        } = self;
        let tenant = tenant.as_deref();
        for item in items.iter_mut().rev() {
            match item.take() {
                None => {}
                Some(Item::Bucket(b)) => {
                    if let Some(bucket) = ledger.bucket(b, tenant) {
                        bucket.refund(now, *cost);
                    }
                }
                Some(Item::Leases(leased)) => {
                    ledger
                        .leases
                        .refund(tenant.map(|t| &t.lease), leased, *cost);
                }
            }
        }
    }

    fn push(&mut self, item: Item) {
        let slot = self.items.iter_mut().find(|i| i.is_none());
        debug_assert!(slot.is_some(), "more than {MAX_ITEMS} scopes charged");
        if let Some(slot) = slot {
            *slot = Some(item);
        }
    }
}

/// A charge list being taken; gives back what it took when dropped uncommitted.
pub(super) struct Taking<'a> {
    ledger: Ledger<'a>,
    now: u64,
    charged: Charged,
}

impl<'a> Taking<'a> {
    /// Nothing taken yet of a call of `cost`, at `now`.
    pub(super) fn new(ledger: Ledger<'a>, now: u64, cost: u64) -> Self {
        Taking {
            ledger,
            now,
            charged: Charged {
                cost,
                ..Charged::default()
            },
        }
    }

    /// Charges the call to `tenant`: its buckets are its own.
    pub(super) fn charge_tenant(&mut self, tenant: Arc<TenantState>) {
        self.charged.tenant = Some(tenant);
    }

    /// Takes the cost from `bucket` (into its reserve too when `reserved`: the caller is under
    /// its fair part); refused for `why`, having given everything back.
    pub(super) fn take(&mut self, bucket: Bucket, reserved: bool, why: Why) -> Result<(), Refusal> {
        let (now, cost) = (self.now, self.charged.cost);
        let taken = match self.ledger.bucket(bucket, self.charged.tenant.as_deref()) {
            None => return Ok(()), // a tenant's bucket without a tenant: nothing to take
            Some(b) if reserved => b.try_take_reserved(now, cost),
            Some(b) => b.try_take(now, cost),
        };
        match taken {
            Ok(()) => {
                self.charged.push(Item::Bucket(bucket));
                Ok(())
            }
            Err(wait) => {
                // The refused caller's own slot in the refill, after the slots already told.
                let wait = self
                    .ledger
                    .bucket(bucket, self.charged.tenant.as_deref())
                    .map_or(wait, |b| b.spread(now, cost, wait));
                Err(self.refuse(why, wait))
            }
        }
    }

    /// Gives everything back: refused for `why`, `wait` ns.
    fn refuse(&mut self, (reason, scope): Why, wait: u64) -> Refusal {
        self.give_back();
        Refusal {
            reason,
            scope,
            wait,
        }
    }

    /// Takes the cost from `bucket` into debt if need be: never refused.
    pub(super) fn force(&mut self, bucket: Bucket) {
        if let Some(b) = self.ledger.bucket(bucket, self.charged.tenant.as_deref()) {
            b.force_take(self.now, self.charged.cost);
            self.charged.push(Item::Bucket(bucket));
        }
    }

    /// When `leasing`, spends the cost from the cluster's global lease, and from the tenant's
    /// too when `tenant`; refused with the lease's scope, having given everything back.
    pub(super) fn leases(&mut self, leasing: bool, tenant: bool) -> Result<(), Refusal> {
        if !leasing {
            return Ok(());
        }
        let lease = self
            .charged
            .tenant
            .as_deref()
            .filter(|_| tenant)
            .map(|t| &t.lease);
        match self.ledger.leases.spend(lease, self.charged.cost) {
            Ok(leased) => {
                self.charged.push(Item::Leases(leased));
                Ok(())
            }
            Err((Scope::Tenant, wait)) => Err(self.refuse(TENANT, wait)),
            Err((_, wait)) => Err(self.refuse(GLOBAL, wait)),
        }
    }

    /// Keeps what was taken: the list to give back if a later stage refuses the call.
    pub(super) fn commit(mut self) -> Charged {
        std::mem::take(&mut self.charged)
    }

    fn give_back(&mut self) {
        self.charged.give_back(self.ledger, self.now);
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::gcra::interval_for_rate;

    /// A full bucket of 1 unit/s holding `burst`.
    fn bucket(burst: u64) -> Gcra {
        Gcra::new(interval_for_rate(1.0), burst)
    }

    #[test]
    fn a_refusal_gives_back_what_was_taken_and_so_does_a_drop() {
        let (fixed, global, leases) = (bucket(10), bucket(3), LeaseGate::default());
        let ledger = Ledger {
            fixed: &fixed,
            global: &global,
            leases: &leases,
        };
        let levels = || (fixed.available(0), global.available(0));
        let full = levels();

        // The second scope refuses: the first gets its units back at once.
        let mut taking = Taking::new(ledger, 0, 5);
        assert_eq!(taking.take(Bucket::FixedGlobal, false, GLOBAL), Ok(()));
        let refused = taking.take(Bucket::Global, false, TENANT).unwrap_err();
        assert_eq!((refused.reason, refused.scope), TENANT);
        assert!(refused.wait > 0);
        assert_eq!(levels(), full);
        drop(taking);
        assert_eq!(levels(), full);

        // Dropped uncommitted: given back.
        let mut taking = Taking::new(ledger, 0, 2);
        taking.take(Bucket::FixedGlobal, false, GLOBAL).unwrap();
        taking.take(Bucket::Global, false, GLOBAL).unwrap();
        assert_ne!(levels(), full);
        drop(taking);
        assert_eq!(levels(), full);

        // Committed: kept until given back; a forced take too; a tenant's bucket without a
        // tenant is nothing.
        let mut taking = Taking::new(ledger, 0, 2);
        taking.take(Bucket::Global, false, GLOBAL).unwrap();
        taking.force(Bucket::FixedGlobal);
        taking.take(Bucket::Share, false, TENANT).unwrap();
        taking.leases(false, true).unwrap();
        let mut charged = taking.commit();
        assert_eq!(levels(), (full.0 - 2, full.1 - 2));
        assert_eq!(charged.cost(), 2);
        assert!(charged.tenant().is_none());
        charged.give_back(ledger, 0);
        assert_eq!(levels(), full);
        charged.give_back(ledger, 0); // once only
        assert_eq!(levels(), full);
    }
}
