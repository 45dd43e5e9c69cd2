//! What perftest prints on standard output around its figures, line for
//! line, so that the output of `iwarp perf` compares with a host's
//! `ib_*_bw -R` / `ib_*_lat -R` by the figures alone: the server's
//! "waiting" banner, the test information block, the local and remote
//! address lines of each data QP (the results table itself is
//! [`super::super::report`]'s).
//!
//! Layouts are perftest 4.5-0.20's (Debian 12), from its public source:
//! `ctx_print_test_info` (`perftest_parameters.c`) and
//! `ctx_print_pingpong_data` with its formats (`perftest_communication.c`
//! and `.h`), as the six tests' `main`s call them, checked against a Linux
//! siw guest's output. What perftest prints of its device, we print of
//! ours, as perftest prints it on iWARP: no LID (0000), the GID the
//! control exchange carries (siw's convention: the MAC), GID index 0 (an
//! Ethernet link), no inline data, no `ibv_wr*` API. With `-R` perftest's
//! address lines carry no RKey, VAddr or outstanding reads: its printer
//! follows the control connection's verb (Send), not the test's.

use core::fmt::Write as _;

use super::super::report::RULE;
use super::super::runner::{Role, TestKind};
use super::wire::Dest;

/// The banner a perftest server prints before it waits for a client.
pub const WAITING_BANNER: &str = "\n************************************\n\
                                  * Waiting for client to connect... *\n\
                                  ************************************\n";

/// What the test information block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestInfo<'a> {
    /// Which test.
    pub test: TestKind,
    /// Which side prints it.
    pub role: Role,
    /// The device's name (perftest: the verbs device, such as `siw0`).
    pub device: &'a str,
    /// Data QPs (`-q`).
    pub qps: usize,
    /// Send queue depth (printed by the client).
    pub tx_depth: u32,
    /// Receive queue depth (printed by the server of the send tests).
    pub rx_depth: u32,
    /// Completion moderation (bandwidth tests).
    pub cq_mod: u64,
    /// The IB MTU code (`enum ibv_mtu`) of the port.
    pub mtu_code: u8,
    /// Outstanding RDMA Reads (read tests).
    pub outstanding_reads: u32,
}

/// perftest's name of a test's verb (`testsStr`).
fn verb(test: TestKind) -> &'static str {
    match test {
        TestKind::WriteBw | TestKind::WriteLat => "RDMA_Write",
        TestKind::ReadBw | TestKind::ReadLat => "RDMA_Read",
        TestKind::SendBw | TestKind::SendLat => "Send",
    }
}

/// The MTU in bytes of an IB MTU code (perftest's `MTU_SIZE`).
pub fn mtu_bytes(code: u8) -> u64 {
    1u64 << (7 + u32::from(code.min(5)))
}

/// The test information block, from its opening rule to its closing one.
pub fn test_info(i: &TestInfo<'_>) -> String {
    let mut s = String::new();
    let mut line = |l: &str| {
        s.push_str(l);
        s.push('\n');
    };
    line(RULE);
    let kind = if i.test.is_latency() { "Latency" } else { "BW" };
    line(&format!("                    {} {kind} Test", verb(i.test)));
    line(&format!(
        " Dual-port       : OFF\t\tDevice         : {}",
        i.device
    ));
    line(&format!(
        " Number of qps   : {}\t\tTransport type : IW",
        i.qps
    ));
    line(" Connection type : RC\t\tUsing SRQ      : OFF");
    // A build of perftest without relaxed-ordering support says so; we
    // have no PCIe function to set it on.
    line(" PCIe relax order: Unsupported");
    line(" ibv_wr* API     : OFF");
    if i.role == Role::Client {
        line(&format!(" TX depth        : {}", i.tx_depth));
    }
    if i.test.is_send() && i.role == Role::Server {
        line(&format!(" RX depth        : {}", i.rx_depth));
    }
    if !i.test.is_latency() {
        line(&format!(" CQ Moderation   : {}", i.cq_mod));
    }
    line(&format!(" Mtu             : {}[B]", mtu_bytes(i.mtu_code)));
    line(" Link type       : Ethernet");
    line(" GID index       : 0");
    if i.test.is_read() {
        line(&format!(" Outstand reads  : {}", i.outstanding_reads));
    } else {
        line(" Max inline data : 0[B]");
    }
    line(" rdma_cm QPs\t : ON");
    line(" Data ex. method : rdma_cm");
    if i.role == Role::Server {
        line(RULE);
        line(" Waiting for client rdma_cm QP to connect");
        line(" Please run the same command with the IB/RoCE interface IP");
    }
    line(RULE);
    s
}

/// C's `%#0Nx`: `0x` and hex digits zero-padded to `width` characters in
/// all, except that zero has no prefix (`0000` for `%#04x`).
fn alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// Whose address lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressOf {
    /// This side's QP.
    Local,
    /// The peer's.
    Remote,
}

/// The two lines perftest prints of one data QP's `pingpong_dest`.
pub fn address_lines(of: AddressOf, d: &Dest) -> String {
    let side = match of {
        AddressOf::Local => "local",
        AddressOf::Remote => "remote",
    };
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}\n GID: ",
        alt_hex(u64::from(d.lid & 0xffff), 4),
        alt_hex(u64::from(d.qpn), 6),
        alt_hex(u64::from(d.psn), 6)
    );
    for (k, b) in d.gid.iter().enumerate() {
        // `%02d` of each byte: decimal, so 0x77 is "119".
        let _ = write!(s, "{}{b:02}", if k == 0 { "" } else { ":" });
    }
    s.push('\n');
    s
}

/// Every data QP's local lines, then every one's remote lines, as
/// perftest prints them (its own before the exchange, the peer's after).
pub fn addresses(local: &[Dest], remote: &[Dest]) -> String {
    let mut s = String::new();
    for d in local {
        s.push_str(&address_lines(AddressOf::Local, d));
    }
    for d in remote {
        s.push_str(&address_lines(AddressOf::Remote, d));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(test: TestKind, role: Role) -> String {
        test_info(&TestInfo {
            test,
            role,
            device: "net_af_packet0",
            qps: 1,
            tx_depth: if test.is_latency() { 1 } else { 128 },
            rx_depth: 512,
            cq_mod: 1,
            mtu_code: 3,
            outstanding_reads: 16,
        })
    }

    /// The lines every block has, in order, with the test's title, and
    /// `extra` (the role's and the test's own) where perftest puts them.
    fn expected(title: &str, tx_rx: &[&str], cq: bool, reads: bool, server: bool) -> String {
        let mut l: Vec<String> = vec![
            RULE.into(),
            format!("                    {title}"),
            " Dual-port       : OFF\t\tDevice         : net_af_packet0".into(),
            " Number of qps   : 1\t\tTransport type : IW".into(),
            " Connection type : RC\t\tUsing SRQ      : OFF".into(),
            " PCIe relax order: Unsupported".into(),
            " ibv_wr* API     : OFF".into(),
        ];
        l.extend(tx_rx.iter().map(|s| s.to_string()));
        if cq {
            l.push(" CQ Moderation   : 1".into());
        }
        l.push(" Mtu             : 1024[B]".into());
        l.push(" Link type       : Ethernet".into());
        l.push(" GID index       : 0".into());
        l.push(if reads {
            " Outstand reads  : 16".into()
        } else {
            " Max inline data : 0[B]".into()
        });
        l.push(" rdma_cm QPs\t : ON".into());
        l.push(" Data ex. method : rdma_cm".into());
        if server {
            l.push(RULE.into());
            l.push(" Waiting for client rdma_cm QP to connect".into());
            l.push(" Please run the same command with the IB/RoCE interface IP".into());
        }
        l.push(RULE.into());
        l.iter().map(|x| format!("{x}\n")).collect()
    }

    const TX_BW: &str = " TX depth        : 128";
    const TX_LAT: &str = " TX depth        : 1";
    const RX: &str = " RX depth        : 512";

    #[test]
    fn write_bw_block_as_perftest_prints_it() {
        let title = "RDMA_Write BW Test";
        assert_eq!(
            info(TestKind::WriteBw, Role::Client),
            expected(title, &[TX_BW], true, false, false)
        );
        assert_eq!(
            info(TestKind::WriteBw, Role::Server),
            expected(title, &[], true, false, true)
        );
    }

    #[test]
    fn read_bw_block_as_perftest_prints_it() {
        let title = "RDMA_Read BW Test";
        assert_eq!(
            info(TestKind::ReadBw, Role::Client),
            expected(title, &[TX_BW], true, true, false)
        );
        assert_eq!(
            info(TestKind::ReadBw, Role::Server),
            expected(title, &[], true, true, true)
        );
    }

    #[test]
    fn send_bw_block_as_perftest_prints_it() {
        let title = "Send BW Test";
        assert_eq!(
            info(TestKind::SendBw, Role::Client),
            expected(title, &[TX_BW], true, false, false)
        );
        assert_eq!(
            info(TestKind::SendBw, Role::Server),
            expected(title, &[RX], true, false, true)
        );
    }

    #[test]
    fn write_lat_block_as_perftest_prints_it() {
        let title = "RDMA_Write Latency Test";
        assert_eq!(
            info(TestKind::WriteLat, Role::Client),
            expected(title, &[TX_LAT], false, false, false)
        );
        assert_eq!(
            info(TestKind::WriteLat, Role::Server),
            expected(title, &[], false, false, true)
        );
    }

    #[test]
    fn read_lat_block_as_perftest_prints_it() {
        let title = "RDMA_Read Latency Test";
        assert_eq!(
            info(TestKind::ReadLat, Role::Client),
            expected(title, &[TX_LAT], false, true, false)
        );
        assert_eq!(
            info(TestKind::ReadLat, Role::Server),
            expected(title, &[], false, true, true)
        );
    }

    #[test]
    fn send_lat_block_as_perftest_prints_it() {
        let title = "Send Latency Test";
        assert_eq!(
            info(TestKind::SendLat, Role::Client),
            expected(title, &[TX_LAT], false, false, false)
        );
        assert_eq!(
            info(TestKind::SendLat, Role::Server),
            expected(title, &[RX], false, false, true)
        );
    }

    /// The lines of a siw guest's `ib_write_bw -R` server (QPN 2 and PSN
    /// 0x60aaae its own; QPN 1 and the 02:00:00:77:00:03 MAC ours).
    #[test]
    fn address_lines_as_a_siw_guest_prints_them() {
        let mut local = Dest {
            qpn: 2,
            psn: 0x60_aaae,
            rkey: 0x1234,
            vaddr: 0x5555_0000_1000,
            out_reads: 1,
            ..Dest::default()
        };
        local.gid[..6].copy_from_slice(&[0x52, 0x54, 0x00, 0x77, 0x00, 0x0b]);
        let mut remote = Dest {
            qpn: 1,
            psn: 0x6c_4be8,
            ..Dest::default()
        };
        remote.gid[..6].copy_from_slice(&[0x02, 0x00, 0x00, 0x77, 0x00, 0x03]);
        assert_eq!(
            addresses(&[local], &[remote]),
            " local address: LID 0000 QPN 0x0002 PSN 0x60aaae\n \
             GID: 82:84:00:119:00:11:00:00:00:00:00:00:00:00:00:00\n \
             remote address: LID 0000 QPN 0x0001 PSN 0x6c4be8\n \
             GID: 02:00:00:119:00:03:00:00:00:00:00:00:00:00:00:00\n"
        );
        // A small PSN keeps `%#06x`'s width; zero loses the prefix.
        let d = Dest {
            qpn: 0x1_2345,
            psn: 0x12,
            lid: 0,
            ..Dest::default()
        };
        let l = address_lines(AddressOf::Local, &d);
        assert!(
            l.starts_with(" local address: LID 0000 QPN 0x12345 PSN 0x0012\n"),
            "{l}"
        );
        assert_eq!(alt_hex(0, 6), "000000");
    }

    #[test]
    fn banner_and_mtu() {
        assert_eq!(
            WAITING_BANNER,
            "\n************************************\n* Waiting for client to connect... \
             *\n************************************\n"
        );
        assert_eq!([1, 2, 3, 4, 5].map(mtu_bytes), [256, 512, 1024, 2048, 4096]);
    }
}
