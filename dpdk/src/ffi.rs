//! The shim's ABI (shim/shim.c): opaque DPDK types behind pointers, plain integers otherwise,
//! so nothing here depends on the layout of DPDK's structs.

use std::ffi::c_char;

/// `struct rte_mbuf`, never dereferenced on this side.
#[repr(C)]
pub struct RteMbuf {
    _opaque: [u8; 0],
}

/// `struct rte_mempool`, never dereferenced on this side.
#[repr(C)]
pub struct RteMempool {
    _opaque: [u8; 0],
}

extern "C" {
    pub fn strait_eal_init(argc: i32, argv: *mut *mut c_char) -> i32;
    pub fn strait_eal_cleanup() -> i32;
    pub fn strait_strerror(err: i32) -> *const c_char;
    pub fn strait_version() -> *const c_char;
    pub fn strait_thread_register() -> i32;
    pub fn strait_thread_unregister();
    pub fn strait_port_by_name(name: *const c_char, port: *mut u16) -> i32;
    pub fn strait_pool_create(
        name: *const c_char,
        n: u32,
        cache: u32,
        socket: i32,
    ) -> *mut RteMempool;
    pub fn strait_port_socket(port: u16) -> i32;
    pub fn strait_port_configure(port: u16, queues: u16, mtu: u16) -> i32;
    pub fn strait_port_queue(
        port: u16,
        queue: u16,
        rx_desc: u16,
        tx_desc: u16,
        mp: *mut RteMempool,
    ) -> i32;
    pub fn strait_port_start(port: u16) -> i32;
    pub fn strait_port_close(port: u16);
    pub fn strait_port_mac(port: u16, out: *mut u8) -> i32;
    pub fn strait_port_link(port: u16, speed: *mut u32) -> i32;
    pub fn strait_port_stats(port: u16, out: *mut u64) -> i32;
    pub fn strait_rx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn strait_tx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn strait_mbuf_view(
        m: *const RteMbuf,
        buf: *mut *mut u8,
        buf_len: *mut u16,
        data_off: *mut u16,
        data_len: *mut u16,
    ) -> u16;
    pub fn strait_mbuf_set(m: *mut RteMbuf, data_off: u16, len: u16);
    pub fn strait_mbuf_alloc(mp: *mut RteMempool) -> *mut RteMbuf;
    pub fn strait_mbuf_free(m: *mut RteMbuf);
    pub fn strait_mbuf_free_bulk(m: *mut *mut RteMbuf, n: u32);
    pub fn strait_pool_avail(mp: *const RteMempool) -> u32;
    pub fn strait_tap_open(
        name: *const c_char,
        mac: *const u8,
        mtu: u16,
        step: *mut *const c_char,
    ) -> i32;
}
