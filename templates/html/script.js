(function(){var d=document;function each(s,f){var l=d.querySelectorAll(s);for(var i=0;i<l.length;i++){f(l[i]);}}
var opened=[];window.addEventListener("beforeprint",function(){opened=[];each("details",function(e){if(!e.open){e.open=true;opened.push(e);}});});
window.addEventListener("afterprint",function(){for(var i=0;i<opened.length;i++){opened[i].open=false;}opened=[];});
each("button.copy",function(b){b.hidden=false;b.addEventListener("click",function(){var t=d.getElementById(b.getAttribute("data-copy"));if(!t||!navigator.clipboard){return;}navigator.clipboard.writeText(t.textContent).then(function(){b.textContent="copied";},function(){b.textContent="select and copy";});});});})();
