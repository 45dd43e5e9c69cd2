//! Protection domains are given back: a domain with a queue pair or a
//! registration in it cannot be freed, and one released while still in use
//! is freed once its objects go, so a service that makes a domain per
//! session never fills the table.

mod runtime_common;

use dataplane::api::{Access, Error, QpOptions, Region};
use rdmap::verbs::VerbsError;
use runtime_common::*;

#[test]
fn busy_domains_stay_and_released_ones_go() {
    let p = Pair::new(&PairOptions::default());
    let dp = &p.a;
    let cq = dp.create_cq(16).unwrap();
    let region = Region::new(4096).unwrap();

    // In use: refused.
    let pd = dp.alloc_pd().unwrap();
    let qp = dp.create_qp(pd, &cq, &cq, QpOptions::default()).unwrap();
    assert_eq!(
        dp.dealloc_pd(pd),
        Err(Error::Verbs(VerbsError::Busy)),
        "a queue pair belongs to it"
    );
    drop(qp);
    let mr = dp
        .reg_mr(pd, &region, 0, 4096, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(dp.dealloc_pd(pd), Err(Error::Verbs(VerbsError::Busy)));
    dp.dereg_mr(&mr).unwrap();
    dp.dealloc_pd(pd).unwrap();
    assert_eq!(dp.dealloc_pd(pd), Err(Error::Verbs(VerbsError::InvalidPd)));

    // Released while in use, many more times than the table holds
    // (1024 domains by default): every one is freed later.
    let rounds = 3000;
    for i in 0..rounds {
        let pd = dp
            .alloc_pd()
            .unwrap_or_else(|e| panic!("round {i}: domains leaked: {e}"));
        let qp = dp.create_qp(pd, &cq, &cq, QpOptions::default()).unwrap();
        let mr = dp
            .reg_mr(pd, &region, 0, 4096, Access::LOCAL_WRITE)
            .unwrap();
        dp.release_pd(pd);
        drop(qp);
        dp.dereg_mr(&mr).unwrap();
    }
    println!("{rounds} domains released while in use, each freed afterwards");
}
