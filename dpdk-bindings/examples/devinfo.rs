//! Prints what each port EAL probed can do: driver, queues, offloads, RSS.
//! The arguments are EAL's, e.g.
//! `cargo run -p dpdk-bindings --example devinfo -- --no-huge -m 256
//! --file-prefix probe --no-pci --vdev=net_af_xdp0,iface=veth0`.

use dpdk_bindings::{offload, Eal, Port};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let eal = match Eal::init(&args) {
        Ok(eal) => eal,
        Err(e) => {
            eprintln!("devinfo: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "DPDK {}, IOVA as VA: {}",
        dpdk_bindings::DPDK_VERSION,
        eal.iova_is_va()
    );
    for id in Port::available(&eal) {
        let port = match Port::from_id(&eal, id) {
            Ok(p) => p,
            Err(e) => {
                println!("port {id}: {e}");
                continue;
            }
        };
        match port.dev_info() {
            Ok(info) => {
                let flag = |capa: u64, f: u64| if capa & f != 0 { "yes" } else { "no" };
                println!(
                    "port {id}: driver {} queues rx {} tx {} mtu {}..{} max frame {}",
                    info.driver_name,
                    info.max_rx_queues,
                    info.max_tx_queues,
                    info.min_mtu,
                    info.max_mtu,
                    info.max_rx_pktlen
                );
                println!(
                    "  tx multi-seg {} tx ipv4/tcp cksum {}/{} rx ipv4/tcp cksum {}/{} rx scatter {}",
                    flag(info.tx_offload_capa, offload::TX_MULTI_SEGS),
                    flag(info.tx_offload_capa, offload::TX_IPV4_CKSUM),
                    flag(info.tx_offload_capa, offload::TX_TCP_CKSUM),
                    flag(info.rx_offload_capa, offload::RX_IPV4_CKSUM),
                    flag(info.rx_offload_capa, offload::RX_TCP_CKSUM),
                    flag(info.rx_offload_capa, offload::RX_SCATTER),
                );
                println!(
                    "  rss types {:#x} reta {} key {} bytes, mac {:02x?}",
                    info.flow_type_rss_offloads,
                    info.reta_size,
                    info.hash_key_size,
                    port.mac_addr().unwrap_or_default()
                );
            }
            Err(e) => println!("port {id}: {e}"),
        }
    }
}
